#!/usr/bin/python3
"""The PyTorch peers of pstrain's click-through (CTR) benchmark, on the very
same Criteo-format files, run beside pstrain in the same run.

Input: tab-separated lines (plain or .gz) of a 0/1 label, 13 integer fields
and 26 categorical hex strings, any field possibly empty. Preprocessing is
pstrain's: a missing or negative integer is 0, then log(1 + x) as float32;
each (field, value) pair, the value being the string read as a hex number
as pstrain reads it and the empty string its field's own value, maps to a
dense row of ONE shared table, factorized over train and test together, so
the table has one row per distinct id and no collisions.

Models (--model):
  dlrm       bottom MLP 13-64-D over the dense features, 26 lookups of dim D
             (nn.EmbeddingBag, mode "sum", sparse, one id per bag), the dot
             products of every pair of the 27 vectors (351, row-major upper
             triangle) concatenated to the bottom output, top MLP D+351-64-1.
  wide_deep  wide: a dim-1 EmbeddingBag summing the 26 ids; deep: the 26
             embeddings and the 13 dense features through 26D+13-64-32; the
             output layer over [wide sum, deep hidden] (33 inputs).
Both end in BCEWithLogitsLoss. Tables start uniform(-s, s), s = --emb-init.

Layouts (--layout):
  single   one process, --threads intra-op threads (default: every core),
           --epochs passes over the training samples in a shuffled order.
  rpc_ddp  the layout of PyTorch's rpc_ddp_tutorial: a ps process holding
           the tables as a torch.distributed.nn.RemoteModule, --trainers
           processes whose dense layers are wrapped in DistributedDataParallel
           (gloo, a group of the trainers only); each step runs in a
           dist_autograd context, the remote tables stepped by a
           DistributedOptimizer (on the ps: TorchScript functional Adagrad,
           which takes the sparse gradients, or torch.optim.SparseAdam under
           DistributedOptimizer's lock), the dense layers by the dense
           optimizer on the gradients the context holds. As in the tutorial,
           each trainer's DistributedOptimizer keeps its own optimizer state
           on the ps (Adagrad's sums of squares per trainer), stepping the
           shared table without waiting for the other trainers. Each
           trainer trains on its own contiguous share of the training
           samples (the last len % trainers samples are dropped so that every
           trainer runs the same number of DDP steps), at the same
           per-trainer batch. Threads per process: max(1, cores // processes)
           unless --threads. Trainer 0 copies the table back from the ps and
           evaluates.
  all      single, then rpc_ddp.

Reported per layout: training samples/s (training samples over the training
wall time, data loading and evaluation excluded), train seconds, the exact
test AUC (ties averaged), the mean test log loss, threads, torch version and
optimizers. --json prints one JSON object per line. --self-test writes a
small planted-signal file pair to a temporary folder, runs both models over
both layouts (one thread a process unless --threads) and checks the
preprocessing, the results and the AUC and log-loss helpers. Exit status 3:
PyTorch is not installed.

  bench_torch_ctr.py --train FILE --test FILE [--model dlrm|wide_deep]
                     [--layout single|rpc_ddp|all] [--epochs 1] [--limit N]
                     [--batch 128] [--embedding-dim 16] [--bottom 64] [--top 64]
                     [--deep 64,32] [--dense-optimizer adam|sgd|adagrad] [--lr X]
                     [--sparse-optimizer adagrad|sparseadam] [--sparse-lr X]
                     [--emb-init 0.01] [--seed 1] [--threads N] [--trainers 2]
                     [--json]
  bench_torch_ctr.py --self-test [--json]
"""
import argparse
import gzip
import json
import os
import random
import re
import socket
import sys
import tempfile
import threading
import time

import numpy as np

try:
    import torch
    from torch import nn
except ImportError:
    print("bench_torch_ctr.py: PyTorch is not installed (tools/setup --bench installs "
          "python3-torch)", file=sys.stderr)
    sys.exit(3)  # tools/bench reports the peer as not installed

INTS, CATS = 13, 26
DEFAULT_LR = {"adam": 1e-3, "sgd": 0.01, "adagrad": 0.01}
DEFAULT_SPARSE_LR = {"adagrad": 0.05, "sparseadam": 1e-3}
SPARSE_STEP = {
    ("single", "adagrad"): "torch.optim.Adagrad",
    ("single", "sparseadam"): "torch.optim.SparseAdam",
    # DistributedOptimizer makes one optimizer per trainer on the ps, each
    # with its own state; Adagrad's is TorchScript, stepped without a lock,
    # SparseAdam's a torch.optim one stepped under DistributedOptimizer's lock.
    ("rpc_ddp", "adagrad"): "DistributedOptimizer: functional Adagrad (TorchScript), "
                            "one per trainer, no lock",
    ("rpc_ddp", "sparseadam"): "DistributedOptimizer: torch.optim.SparseAdam, one per "
                               "trainer, under a lock",
}
FIELDS = ("bench", "model", "layout", "train_samples", "epochs", "batch", "samples_per_s",
          "train_seconds", "test_samples", "auc", "logloss", "threads", "processes", "trainers",
          "torch", "dense_optimizer", "lr", "sparse_optimizer", "sparse_lr", "sparse_step",
          "table_rows", "embedding_dim")


# ---------------------------------------------------------------- data

HEX = re.compile(r"[0-9a-fA-F]{1,16}")


class Ids:
    """The shared id space: one dict per categorical field, ids handed out
    in order of first appearance, across every file read through it. As
    pstrain's reader (client/data/criteo_reader.h) does, a value is its
    string read as a hexadecimal number of 1 to 16 digits ("0A" and "a" are
    one value), the empty string its field's own value."""

    def __init__(self):
        self.fields = [{} for _ in range(CATS)]
        self.rows = 0

    def chunk(self, values, where):
        """values: the categorical strings of some lines, line-major."""
        out = np.empty(len(values), dtype=np.int64)
        fields = self.fields
        for i, s in enumerate(values):
            d = fields[i % CATS]
            key = int(s, 16) if s else -1
            row = d.get(key)
            if row is None:
                if s and not HEX.fullmatch(s):
                    raise SystemExit(f"bench_torch_ctr.py: {where}: C{i % CATS + 1}: expected "
                                     f"1 to 16 hexadecimal digits, got {s!r}")
                row = d[key] = self.rows
                self.rows += 1
            out[i] = row
        return out


def read_criteo(path, ids, limit=None, chunk_lines=65536):
    """Returns (dense float32 [n,13], ids int64 [n,26], labels float32 [n])."""
    opener = gzip.open if path.endswith(".gz") else open
    dense, cats, labels = [], [], []
    with opener(path, "rt", encoding="utf-8", newline="\n") as f:
        lab, ints, strs, n = [], [], [], 0

        def flush():
            if not lab:
                return
            a = np.array(ints)
            a = np.where(a == "", "0", a).astype(np.int64)
            dense.append(np.log1p(np.maximum(a, 0).astype(np.float64))
                         .astype(np.float32).reshape(-1, INTS))
            cats.append(ids.chunk(strs, path).reshape(-1, CATS))
            labels.append(np.array(lab, dtype=np.float32))
            lab.clear(), ints.clear(), strs.clear()

        for number, line in enumerate(f, 1):
            if limit is not None and n >= limit:
                break
            parts = line.rstrip("\r\n").split("\t")
            if len(parts) != 1 + INTS + CATS:
                if not line.strip():
                    continue
                raise SystemExit(f"bench_torch_ctr.py: {path}:{number}: {len(parts)} fields, "
                                 f"not {1 + INTS + CATS}")
            if parts[0] not in ("0", "1"):
                raise SystemExit(f"bench_torch_ctr.py: {path}:{number}: label: expected 0 or "
                                 f"1, got {parts[0]!r}")
            lab.append(float(parts[0]))
            ints.extend(parts[1:1 + INTS])
            strs.extend(parts[1 + INTS:])
            n += 1
            if len(lab) == chunk_lines:
                flush()
        flush()
    if not labels:
        raise SystemExit(f"bench_torch_ctr.py: {path}: no samples")
    return np.concatenate(dense), np.concatenate(cats), np.concatenate(labels)


# ---------------------------------------------------------------- metrics

def exact_auc(scores, labels):
    """The probability that a positive scores above a negative, ties counting
    one half: the rank-sum (Mann-Whitney) statistic with tied ranks averaged."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels) > 0.5
    pos = int(labels.sum())
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    ends = np.r_[starts[1:], len(s)]
    mean_rank = (starts + ends + 1) / 2.0  # 1-based ranks start+1..end, averaged
    ranks = np.empty(len(s))
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def mean_logloss(logits, labels):
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if len(z) == 0:
        return 0.0
    return float(np.mean(np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))))


# ---------------------------------------------------------------- models

class Tables(nn.Module):
    """Every table of a model: the deep embeddings (dim D, one id per bag)
    and, for wide_deep, the wide weights (dim 1, the 26 ids of a sample in
    one bag). forward(ids [B,26]) -> [B, 26*D (+1)]: the deep rows flattened,
    then the wide sum."""

    def __init__(self, rows, dim, wide, init, seed):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.deep = nn.EmbeddingBag(rows, dim, mode="sum", sparse=True)
        self.wide = nn.EmbeddingBag(rows, 1, mode="sum", sparse=True) if wide else None
        with torch.no_grad():
            for table in (self.deep, self.wide):
                if table is not None:
                    table.weight.uniform_(-init, init, generator=generator)

    def forward(self, ids):
        batch = ids.shape[0]
        deep = self.deep(ids.reshape(-1, 1)).reshape(batch, -1)
        if self.wide is None:
            return deep
        return torch.cat([deep, self.wide(ids)], 1)


def mlp(sizes):
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return layers


class DLRMDense(nn.Module):
    def __init__(self, dim, bottom, top):
        super().__init__()
        self.dim = dim
        self.bottom = nn.Sequential(*mlp([INTS] + bottom + [dim]))
        vectors = CATS + 1
        self.pairs = vectors * (vectors - 1) // 2
        rows, cols = torch.triu_indices(vectors, vectors, offset=1)
        self.register_buffer("flat_pairs", rows * vectors + cols, persistent=False)
        self.top = nn.Sequential(*mlp([dim + self.pairs] + top),
                                 nn.Linear(top[-1] if top else dim + self.pairs, 1))

    def forward(self, dense, emb):
        z = self.bottom(dense)
        vectors = torch.cat([z.unsqueeze(1), emb.reshape(-1, CATS, self.dim)], 1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2)).flatten(1)[:, self.flat_pairs]
        return self.top(torch.cat([z, dots], 1))


class WideDeepDense(nn.Module):
    def __init__(self, dim, deep):
        super().__init__()
        self.dim = dim
        self.deep = nn.Sequential(*mlp([CATS * dim + INTS] + deep))
        self.out = nn.Linear(1 + (deep[-1] if deep else CATS * dim + INTS), 1)

    def forward(self, dense, emb):
        wide = emb[:, CATS * self.dim:]
        hidden = self.deep(torch.cat([emb[:, :CATS * self.dim], dense], 1))
        return self.out(torch.cat([wide, hidden], 1))


def dense_model(args):
    torch.manual_seed(args.seed)
    if args.model == "dlrm":
        return DLRMDense(args.embedding_dim, args.bottom, args.top)
    return WideDeepDense(args.embedding_dim, args.deep)


def tables_args(args, rows):
    return (rows, args.embedding_dim, args.model == "wide_deep", args.emb_init, args.seed + 1)


def dense_optimizer(args, params):
    if args.dense_optimizer == "adam":
        return torch.optim.Adam(params, lr=args.lr)
    if args.dense_optimizer == "sgd":
        return torch.optim.SGD(params, lr=args.lr)
    return torch.optim.Adagrad(params, lr=args.lr)


def sparse_class(args):
    return torch.optim.Adagrad if args.sparse_optimizer == "adagrad" else torch.optim.SparseAdam


def evaluate(tables, dense, data, batch=8192):
    x, ids, y = data
    logits = []
    with torch.no_grad():
        for i in range(0, len(y), batch):
            logits.append(dense(x[i:i + batch], tables(ids[i:i + batch])).reshape(-1))
    logits = torch.cat(logits).numpy()
    return exact_auc(logits, y.numpy()), mean_logloss(logits, y.numpy())


def to_tensors(dense, ids, labels):
    return (torch.from_numpy(np.ascontiguousarray(dense)),
            torch.from_numpy(np.ascontiguousarray(ids)),
            torch.from_numpy(np.ascontiguousarray(labels)))


def result(args, layout, samples, seconds, test, auc, logloss, threads, processes, rows):
    return {"bench": "torch_ctr", "model": args.model, "layout": layout,
            "train_samples": samples, "epochs": args.epochs, "batch": args.batch,
            "samples_per_s": samples / seconds, "train_seconds": seconds,
            "test_samples": test, "auc": auc, "logloss": logloss, "threads": threads,
            "processes": processes, "trainers": processes - 1 if processes > 1 else 0,
            "torch": torch.__version__, "dense_optimizer": args.dense_optimizer, "lr": args.lr,
            "sparse_optimizer": args.sparse_optimizer, "sparse_lr": args.sparse_lr,
            "sparse_step": SPARSE_STEP[layout, args.sparse_optimizer], "table_rows": rows,
            "embedding_dim": args.embedding_dim, "zero_grad": args.zero_grad}


# ---------------------------------------------------------------- single

def run_single(args, train, test, rows):
    threads = args.threads or os.cpu_count()
    torch.set_num_threads(threads)
    x, ids, y = to_tensors(*train)
    y = y.unsqueeze(1)
    dense = dense_model(args)
    tables = Tables(*tables_args(args, rows))
    dense_opt = dense_optimizer(args, dense.parameters())
    table_opt = sparse_class(args)(tables.parameters(), lr=args.sparse_lr)
    loss_fn = nn.BCEWithLogitsLoss()
    generator = torch.Generator().manual_seed(args.seed + 2)
    n = len(y)
    start = time.perf_counter()
    for _ in range(args.epochs):
        order = torch.randperm(n, generator=generator)
        for i in range(0, n, args.batch):
            index = order[i:i + args.batch]
            loss = loss_fn(dense(x[index], tables(ids[index])), y[index])
            # --zero-grad: the dense gradients freed (none) or zeroed in place
            # (zeros, torch 1.13's default), whichever the caller found
            # faster; the tables' sparse gradients are made afresh each step.
            dense_opt.zero_grad(set_to_none=args.zero_grad == "none")
            table_opt.zero_grad(set_to_none=True)  # sparse gradients: freed
            loss.backward()
            dense_opt.step()
            table_opt.step()
    seconds = time.perf_counter() - start
    auc, logloss = evaluate(tables, dense, to_tensors(*test))
    out = result(args, "single", n * args.epochs, seconds, len(test[2]), auc, logloss,
                 threads, 1, rows)
    if args.self_test:
        out["rows_updated"] = rows_updated(args, rows, tables)
    return out


def rows_updated(args, rows, tables):
    """The table rows (of the deep table, and of the wide one) that training
    moved from their initial values: a self-test check."""
    fresh = Tables(*tables_args(args, rows))
    return [int((a != b).any(1).sum()) for a, b in zip(tables.state_dict().values(),
                                                       fresh.state_dict().values())]


# ---------------------------------------------------------------- rpc_ddp

PS_TABLES = None
PS_READY = threading.Event()


def _ps_tables():
    """Runs on the ps at a trainer's request: the RemoteModule, once made."""
    PS_READY.wait()
    return PS_TABLES


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def rpc_ddp_rank(rank, args, folder, rows, ports, threads):
    """Rank 0 is the ps, 1..trainers the trainers."""
    global PS_TABLES
    import torch.distributed as dist
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc
    from torch.distributed.nn import RemoteModule
    from torch.distributed.optim import DistributedOptimizer
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(threads)
    trainers = args.trainers
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{ports[0]}",
                                              num_worker_threads=max(4, 2 * trainers),
                                              rpc_timeout=600)
    if rank == 0:
        rpc.init_rpc("ps", rank=0, world_size=trainers + 1, rpc_backend_options=options)
        PS_TABLES = RemoteModule("ps/cpu", Tables, args=tables_args(args, rows))
        PS_READY.set()
        rpc.shutdown()  # waits for every trainer
        return

    me = rank - 1

    def arrays(split):
        return [np.load(os.path.join(folder, f"{split}_{name}.npy"), mmap_mode="r")
                for name in ("dense", "ids", "labels")]

    train = arrays("train")
    share = len(train[2]) // trainers
    part = slice(me * share, (me + 1) * share)
    # In memory, as in the single layout: no page faults in the timed loop.
    x, ids, y = to_tensors(*(np.array(a[part]) for a in train))
    y = y.unsqueeze(1)
    if me == 0:
        test = to_tensors(*(np.array(a) for a in arrays("test")))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{ports[1]}", rank=me,
                            world_size=trainers)
    rpc.init_rpc(f"trainer{me}", rank=rank, world_size=trainers + 1,
                 rpc_backend_options=options)
    tables = rpc.rpc_sync("ps", _ps_tables)
    dense = dense_model(args)
    ddp = DistributedDataParallel(dense)
    params = list(ddp.parameters())
    dense_opt = dense_optimizer(args, params)
    table_opt = DistributedOptimizer(sparse_class(args), tables.remote_parameters(),
                                     lr=args.sparse_lr)
    loss_fn = nn.BCEWithLogitsLoss()
    generator = torch.Generator().manual_seed(args.seed + 2 + me)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.epochs):
        order = torch.randperm(share, generator=generator)
        for i in range(0, share, args.batch):
            index = order[i:i + args.batch]
            with dist_autograd.context() as context:
                loss = loss_fn(ddp(x[index], tables.forward(ids[index])), y[index])
                dist_autograd.backward(context, [loss])
                grads = dist_autograd.get_gradients(context)
                for p in params:
                    p.grad = grads.get(p)
                dense_opt.step()
                table_opt.step(context)
    dist.barrier()
    seconds = time.perf_counter() - start
    if args.self_test:
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        replicas = [torch.empty_like(flat) for _ in range(trainers)]
        dist.all_gather(replicas, flat)
        assert all(torch.equal(r, flat) for r in replicas), "DDP replicas differ"
    if me == 0:
        local = Tables(*tables_args(args, rows))
        local.load_state_dict(tables.get_module_rref().rpc_sync().state_dict())
        auc, logloss = evaluate(local, dense, test)
        out = result(args, "rpc_ddp", share * trainers * args.epochs, seconds, len(test[2]),
                     auc, logloss, threads, trainers + 1, rows)
        if args.self_test:
            out["rows_updated"] = rows_updated(args, rows, local)
        with open(os.path.join(folder, "result.json"), "w") as f:
            json.dump(out, f)
    dist.barrier()
    rpc.shutdown()
    dist.destroy_process_group()


def run_rpc_ddp(args, train, test, rows):
    import torch.multiprocessing as mp
    processes = args.trainers + 1
    threads = args.threads or max(1, os.cpu_count() // processes)
    # RPC's and gloo's transports listen on the interface of the host's name
    # unless told: the loopback keeps every peer on this machine.
    os.environ.setdefault("TP_SOCKET_IFNAME", "lo")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("GLOG_minloglevel", "1")  # no "RPC agent is shutting down" lines
    with tempfile.TemporaryDirectory(prefix="bench_torch_ctr.") as folder:
        for split, arrays in (("train", train), ("test", test)):
            for name, array in zip(("dense", "ids", "labels"), arrays):
                np.save(os.path.join(folder, f"{split}_{name}.npy"), array)
        mp.spawn(rpc_ddp_rank, args=(args, folder, rows, _free_ports(2), threads),
                 nprocs=processes, join=True)
        with open(os.path.join(folder, "result.json")) as f:
            return json.load(f)


# ---------------------------------------------------------------- driver

def load(args):
    """The parsed splits; with --cache FILE, read from FILE when it was made
    from the same files (paths, sizes, times) and limit, else parsed and saved
    there: the parsing is pure Python, slower than the training it feeds."""
    key = json.dumps([[p, os.path.getsize(p), os.path.getmtime(p)] for p in (args.train, args.test)]
                     + [args.limit])
    if args.cache and os.path.exists(args.cache):
        with np.load(args.cache) as z:
            if str(z["key"]) == key:
                return ((z["train_dense"], z["train_ids"], z["train_labels"]),
                        (z["test_dense"], z["test_ids"], z["test_labels"]), int(z["rows"]))
    ids = Ids()
    train = read_criteo(args.train, ids, args.limit)
    test = read_criteo(args.test, ids)
    if args.cache:
        with open(args.cache, "wb") as f:
            np.savez(f, key=key, rows=ids.rows, train_dense=train[0], train_ids=train[1],
                     train_labels=train[2], test_dense=test[0], test_ids=test[1],
                     test_labels=test[2])
    return train, test, ids.rows


def run(args, data):
    train, test, rows = data
    layouts = ("single", "rpc_ddp") if args.layout == "all" else (args.layout,)
    out = []
    for layout in layouts:
        r = (run_single if layout == "single" else run_rpc_ddp)(args, train, test, rows)
        if args.json:
            print(json.dumps(r), flush=True)
        else:
            print(f"{r['model']:9} {layout:7} {r['samples_per_s']:10.0f} samples/s "
                  f"{r['train_seconds']:8.2f} s  AUC {r['auc']:.4f}  logloss "
                  f"{r['logloss']:.4f}  {r['processes']} proc x {r['threads']} threads, "
                  f"{r['train_samples']} samples, {r['table_rows']} rows, "
                  f"{r['dense_optimizer']} {r['lr']:g} / {r['sparse_optimizer']} "
                  f"{r['sparse_lr']:g} ({r['sparse_step']}), torch {r['torch']}", flush=True)
        out.append(r)
    return out


def write_planted(files, rng):
    """Criteo-format files, (path, lines) each, whose click odds rise with
    categorical field 0's value, field 1's value and integer field 0, the
    same effects in every file; other fields are noise, any field may be
    empty, integers may be negative."""
    vocab = [[f"{rng.getrandbits(32):08x}" for _ in range(8 if f < 2 else 200)]
             for f in range(CATS)]
    effect = [[rng.gauss(0, 2) for _ in range(len(v))] for v in vocab[:2]]
    for path, lines in files:
        with (gzip.open(path, "wt") if path.endswith(".gz") else open(path, "w")) as f:
            for _ in range(lines):
                ints = [rng.choice([-1, 0, rng.randrange(1000)]) for _ in range(INTS)]
                ints = [("" if rng.random() < 0.1 else str(v)) for v in ints]
                picks = [rng.randrange(len(v)) for v in vocab]
                cats = [("" if f > 1 and rng.random() < 0.1 else vocab[f][p])
                        for f, p in enumerate(picks)]
                i0 = max(int(ints[0] or 0), 0)
                z = effect[0][picks[0]] + effect[1][picks[1]] + 0.6 * (np.log1p(i0) - 3)
                label = int(rng.random() < 1 / (1 + np.exp(-z)))
                f.write("\t".join([str(label)] + ints + cats) + "\n")


def self_test(args):
    rng = random.Random(7)
    n = 300
    scores = [rng.choice([0.1, 0.2, 0.3, 0.5, 0.9]) for _ in range(n)]
    labels = [rng.randrange(2) for _ in range(n)]
    pairs = sum((1.0 if p > q else 0.5 if p == q else 0.0)
                for p, a in zip(scores, labels) if a for q, b in zip(scores, labels) if not b)
    brute = pairs / (sum(labels) * (n - sum(labels)))
    assert abs(exact_auc(scores, labels) - brute) < 1e-12, (exact_auc(scores, labels), brute)
    assert exact_auc([1, 2, 3, 4], [0, 0, 1, 1]) == 1.0
    assert exact_auc([5, 5, 5, 5], [0, 1, 0, 1]) == 0.5
    try:
        from sklearn.metrics import roc_auc_score
    except ImportError:
        roc_auc_score = None
    if roc_auc_score is not None:
        assert abs(roc_auc_score(labels, scores) - brute) < 1e-12
    z = np.array([-30.0, -1.0, 0.0, 2.0, 40.0])
    y = np.array([0, 1, 1, 0, 1])
    direct = -np.mean(y * np.log(1 / (1 + np.exp(-z))) + (1 - y) * np.log(1 - 1 / (1 + np.exp(-z))
                                                                        + 1e-300))
    assert abs(mean_logloss(z, y) - direct) < 1e-9, (mean_logloss(z, y), direct)
    print(f"self-test: AUC helper matches the brute-force pair count ({brute:.6f})"
          f"{', sklearn' if roc_auc_score else ' (sklearn not importable)'}, logloss helper ok",
          file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="bench_torch_ctr_selftest.") as folder:
        hand = os.path.join(folder, "hand.tsv.gz")
        cats = ["68fd1e64"] * CATS
        with gzip.open(hand, "wt") as f:
            f.write("\t".join(["1", "", "-5", "3"] + ["0"] * 10 + cats) + "\n")
            f.write("\t".join(["0", "7"] + [""] * 12 + [""] + ["068FD1E64"] * 25) + "\n")
        ids = Ids()
        x, c, y = read_criteo(hand, ids)
        assert y.tolist() == [1.0, 0.0] and x.dtype == np.float32 and c.shape == (2, CATS)
        assert x[0, :3].tolist() == [0.0, 0.0, np.float32(np.log1p(3.0))]
        assert x[1, 0] == np.float32(np.log1p(7.0)) and (x[1, 1:] == 0).all()
        assert c[0].tolist() == list(range(CATS)) and c[1, 1:].tolist() == list(range(1, CATS))
        assert c[1, 0] == CATS and ids.rows == CATS + 1

        args.train = os.path.join(folder, "train.tsv")
        args.test = os.path.join(folder, "test.tsv.gz")
        write_planted([(args.train, 4000), (args.test, 1000)], rng)
        data = load(args)
    train, test, rows = data
    assert train[0].shape == (4000, INTS) and train[1].shape == (4000, CATS)
    assert test[2].shape == (1000,) and rows == len(np.unique(np.concatenate([train[1], test[1]])))
    assert train[1].max() == rows - 1 and (train[0] >= 0).all()
    # One thread a process unless told: on a loaded machine, intra-op
    # threads that wait on each other turn a seconds-long check into minutes.
    args.threads = args.threads or 1
    failures = []
    for model in ("dlrm", "wide_deep"):
        args.model = model
        args.layout = "all"
        for r in run(args, data):
            missing = [k for k in FIELDS if k not in r]
            if missing:
                failures.append(f"{model} {r['layout']}: fields missing {missing}")
            if not r["auc"] > 0.6:
                failures.append(f"{model} {r['layout']}: AUC {r['auc']:.4f} not above 0.6")
            trained = [len(np.unique(train[1]))] * (2 if model == "wide_deep" else 1)
            if r.pop("rows_updated") != trained:
                failures.append(f"{model} {r['layout']}: not every trained row moved")
            if r["train_samples"] != 4000 or r["test_samples"] != 1000:
                failures.append(f"{model} {r['layout']}: samples {r['train_samples']}/"
                                f"{r['test_samples']}")
    if failures:
        print("self-test FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
        sys.exit(1)
    print("self-test passed", file=sys.stderr)


def sizes(text):
    return [int(v) for v in text.split(",") if v.strip()]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train")
    parser.add_argument("--test")
    parser.add_argument("--model", choices=("dlrm", "wide_deep"), default="dlrm")
    parser.add_argument("--layout", choices=("single", "rpc_ddp", "all"), default="all")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--limit", type=int, help="use the first N training lines")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--embedding-dim", type=int, default=16)
    parser.add_argument("--bottom", type=sizes, default=[64])
    parser.add_argument("--top", type=sizes, default=[64])
    parser.add_argument("--deep", type=sizes, default=[64, 32])
    parser.add_argument("--dense-optimizer", choices=("adam", "sgd", "adagrad"), default="adam")
    parser.add_argument("--lr", type=float, help="default: adam 1e-3, sgd 0.01, adagrad 0.01")
    parser.add_argument("--sparse-optimizer", choices=("adagrad", "sparseadam"),
                        default="adagrad")
    parser.add_argument("--sparse-lr", type=float, help="default: adagrad 0.05, sparseadam 1e-3")
    parser.add_argument("--emb-init", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, help="per process; default: every core "
                        "(single), max(1, cores // processes) (rpc_ddp)")
    parser.add_argument("--trainers", type=int, default=2)
    parser.add_argument("--zero-grad", choices=("none", "zeros"), default="none",
                        help="single: free the dense gradients each step (none) or zero them "
                             "in place (zeros); tools/bench measures both")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--cache", metavar="FILE",
                        help="keep the parsed files in FILE (.npz) for the next run on them")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.lr is None:
        args.lr = DEFAULT_LR[args.dense_optimizer]
    if args.sparse_lr is None:
        args.sparse_lr = DEFAULT_SPARSE_LR[args.sparse_optimizer]
    if args.self_test:
        self_test(args)
        return
    if not args.train or not args.test:
        parser.error("--train and --test are required (or --self-test)")
    run(args, load(args))


if __name__ == "__main__":
    main()
