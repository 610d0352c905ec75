#!/usr/bin/python3
"""The peer of bench_embeddings rows: the same lookup and update in one
PyTorch process, nn.EmbeddingBag(sparse=True) with Adagrad (and SparseAdam),
as a single-machine user would train a table that fits in memory, on
every core (PyTorch's default here is one thread).

For each dim and batch of unique ids: the ids as bags of one row each,
forward, a backward from a fixed gradient, the optimizer's step; rows/s of
the whole lookup-and-update, median (min-max) of the reps. JSON lines
with --json.

  bench_torch_embedding.py [--reps N] [--quick] [--json] [--table-rows N]
"""
import argparse
import json
import os
import statistics
import sys
import time

try:
    import torch
except ImportError:
    print("bench_torch_embedding.py: PyTorch is not installed (tools/setup --bench installs "
          "python3-torch)", file=sys.stderr)
    sys.exit(3)  # tools/bench reports the peer as not installed


def measure(dim, ids, optimizer, reps, table_rows):
    torch.manual_seed(dim)
    bag = torch.nn.EmbeddingBag(table_rows, dim, mode="sum", sparse=True)
    opt = (torch.optim.Adagrad if optimizer == "adagrad" else torch.optim.SparseAdam)(
        bag.parameters(), lr=1e-3)
    index = torch.randperm(table_rows)[:ids].sort().values
    offsets = torch.arange(ids)
    grad = torch.full((ids, dim), 1e-3)
    steps = max(3, min(200, 2_000_000 // ids))

    def rep():
        start = time.perf_counter()
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)  # sparse gradients: freed, never zeroed in place
            bag(index, offsets).backward(grad)
            opt.step()
        return ids * steps / (time.perf_counter() - start)

    rep()  # warm-up: allocations, the optimizer's state
    return [rep() for _ in range(reps)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--table-rows", type=int, default=1_000_000)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not args.json:
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, a table of "
              f"{args.table_rows} rows; rows/s of lookup and update")
    for dim in (16, 64) if args.quick else (16, 64, 128):
        for ids in (1000, 10000) if args.quick else (1000, 10000, 100000):
            for optimizer in ("adagrad", "sparse_adam"):
                rates = measure(dim, ids, optimizer, args.reps, args.table_rows)
                if args.json:
                    print(json.dumps({"bench": "torch_embedding", "dim": dim, "ids": ids,
                                      "optimizer": optimizer, "rows_per_s": rates}))
                else:
                    print(f"dim {dim:4} ids {ids:7} {optimizer:12} "
                          f"{statistics.median(rates) / 1e6:.3g}M rows/s "
                          f"({min(rates) / 1e6:.3g}-{max(rates) / 1e6:.3g})")


if __name__ == "__main__":
    main()
