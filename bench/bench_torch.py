#!/usr/bin/python3
"""The PyTorch peers that tools/bench runs beside pstrain's benchmarks, each in
a process of its own so that an absent or broken PyTorch only costs its rows.

    bench_torch.py compute --model mlp|cnn [--batch 64] [--windows 7]
    bench_torch.py ddp [--batch 64] [--steps 200] [--bucket-bytes 262144]
    bench_torch.py tta --data DIR [--model mlp|cnn] [--target 0.85] [--epochs 3]
                       [--eval-every 30000]
    bench_torch.py rpcps --data DIR [--model mlp|cnn] [--target 0.85] [--epochs 3]
                         [--eval-every 30000]
    every command: [--zero-grad best|none|zeros]

Each prints one JSON object per line. The models have the shapes of pstrain's
presets (client/model/model.cc): mlp 784-256-128-10, cnn conv 32 3x3, pool 2,
conv 64 3x3, pool 2, dense 128, 10, on 1x28x28 inputs, ReLU after every
hidden layer, softmax cross-entropy. `tta` trains pstrain's default job
(cluster.yaml) with DDP instead: the MLP (or --model cnn) on Fashion-MNIST,
2 workers x 1 thread, batch 64 each, Nesterov momentum 0.9, lr 0.02, an
evaluation on the test set every 30000 global samples, time from the first
step to the evaluation whose weights first reach the target, as
tools/report.py times pstrain's runs; and the training's samples/s (with
--eval-every 0, evaluations off, training throughput on the real data,
--epochs may be a fraction). `rpcps` trains the same job as an asynchronous
parameter server on torch.distributed.rpc, pstrain's own layout: 2 ps
processes holding the parameters split between them, each applying the
optimizer to its part under a lock as gradients arrive, and 2 trainers that
fetch the weights, compute a gradient on their half of the data and push it,
without waiting for each other; the ps evaluates the pulled weights on the
same cadence and prints the same fields as `tta`. Exit status 3: PyTorch is
not installed.

Every peer runs at its best. How a step clears the gradients is the one
setting whose two reasonable values differ in speed here: zero_grad with
set_to_none=True frees them, so backward allocates them afresh every step;
False (PyTorch 1.13's default) zeroes them in place. Which is faster depends
on the model, the version and the machine (the MLP at batch 64 ran 25-80%
faster zeroing in place with Debian's 1.13; the CNN about even), so
--zero-grad best (the default) times forward and backward both ways in this
run, alternately, and every step of the peer then clears gradients the
faster way; each result says which way it used ("zero_grad": "none" or
"zeros") and the rates measured both ways. `compute` measures both ways
window by window and reports the faster's windows.
"""

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import threading
import time

try:
    import torch
    import torch.distributed as dist
    import torch.distributed.rpc as rpc
    from torch import nn
except ImportError as e:
    print(f"PyTorch not importable: {e}", file=sys.stderr)
    sys.exit(3)


def model(preset):
    if preset == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                             nn.ReLU(), nn.Linear(128, 10))
    if preset == "cnn":
        return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3),
                             nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(1600, 128),
                             nn.ReLU(), nn.Linear(128, 10))
    raise SystemExit(f"bench_torch.py: unknown model {preset!r}")


def batch(size, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(size, 1, 28, 28, generator=g), torch.randint(0, 10, (size,), generator=g)


def one_thread():
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)


ZERO_GRAD = ("none", "zeros")  # zero_grad(set_to_none=True), and False


def clear(owner, way):
    """Clears the gradients of owner (a module or an optimizer) the given way."""
    owner.zero_grad(set_to_none=way == "none")


def windows(step, batch_size, count, ways):
    """Each way's samples/s over `count` windows of about 0.5 s each (sized by
    a warm-up of every way), the ways alternated window by window so that a
    change of the machine's speed touches all alike."""
    steps = 1
    while True:
        start = time.perf_counter()
        for way in ways:
            for _ in range(steps):
                step(way)
        took = (time.perf_counter() - start) / len(ways)
        if took > 0.25:
            steps = max(1, int(steps * 0.5 / took))
            break
        steps *= 2
    rates = {way: [] for way in ways}
    for _ in range(count):
        for way in ways:
            start = time.perf_counter()
            for _ in range(steps):
                step(way)
            rates[way].append(steps * batch_size / (time.perf_counter() - start))
    return rates


def step_fn(preset, batch_size):
    net, loss_fn = model(preset), nn.CrossEntropyLoss()
    x, y = batch(batch_size)

    def step(way):
        clear(net, way)
        loss_fn(net(x), y).backward()
    return step


def faster(rates):
    """The way whose median samples/s is highest."""
    return max(rates, key=lambda way: statistics.median(rates[way]))


def resolve_zero_grad(arg, presets, batch_size):
    """--zero-grad for the ranks a command starts, as {preset: {"zero_grad":
    way, "zero_grad_rates": {way: samples/s}}}: `best` measures each preset
    both ways (1 thread, 3 short windows each) in this process, before the
    ranks start, and takes the faster; a way named is used for every preset,
    unmeasured."""
    out = {}
    for p in presets:
        if arg != "best":
            out[p] = {"zero_grad": arg, "zero_grad_rates": {}}
            continue
        rates = windows(step_fn(p, batch_size), batch_size, 3, ZERO_GRAD)
        out[p] = {"zero_grad": faster(rates),
                  "zero_grad_rates": {w: statistics.median(r) for w, r in rates.items()}}
    return out


def compute(args):
    """forward + backward + loss, timed as bench_compute times it: windows of
    about 0.5 s after a warm-up that sizes them; every window's samples/s of
    the way of clearing gradients used (--zero-grad; best: both measured,
    alternately, and the faster's windows reported)."""
    one_thread()
    ways = ZERO_GRAD if args.zero_grad == "best" else (args.zero_grad,)
    rates = windows(step_fn(args.model, args.batch), args.batch, args.windows, ways)
    way = faster(rates)
    print(json.dumps({"bench": "compute", "model": args.model, "batch": args.batch,
                      "torch": torch.__version__, "samples_per_s": sorted(rates[way]),
                      "zero_grad": way,
                      "zero_grad_rates": {w: statistics.median(r) for w, r in rates.items()}}))


def ddp_rank(rank, store_file, args):
    """One of the two DDP processes: the step as bench_allreduce's sync step
    (SGD, synthetic data, 1 thread, buckets of the same size), 5 untimed
    steps, then per model samples/s of both workers from rank 0."""
    one_thread()
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=2)
    chosen = json.loads(args.zero_grad)
    for preset in ("mlp", "cnn"):
        net = nn.parallel.DistributedDataParallel(
            model(preset), bucket_cap_mb=args.bucket_bytes / (1024 * 1024))
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        loss_fn = nn.CrossEntropyLoss()
        x, y = batch(args.batch, seed=rank + 1)
        n = max(args.steps // 8, 20) if preset == "cnn" else args.steps
        for s in range(-5, n):
            if s == 0:
                dist.barrier()
                start = time.perf_counter()
            clear(opt, chosen[preset]["zero_grad"])
            loss_fn(net(x), y).backward()
            opt.step()
        seconds = time.perf_counter() - start
        if rank == 0:
            print(json.dumps({"bench": "sync_step", "model": preset, "batch": args.batch,
                              "steps": n, "samples_per_s": 2 * args.batch * n / seconds,
                              **chosen[preset]}), flush=True)
    dist.destroy_process_group()


def idx(path):
    """An IDX file's values as a uint8 tensor of its shape."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return torch.frombuffer(bytearray(raw[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


def fashion(data, split):
    images = idx(os.path.join(data, f"{split}-images-idx3-ubyte.gz")).float().div_(255)
    labels = idx(os.path.join(data, f"{split}-labels-idx1-ubyte.gz")).long()
    return images.unsqueeze(1), labels


def tta_rank(rank, store_file, args):
    """One DDP worker of the default job; rank 0 evaluates every eval_every
    global samples and both stop once the target is reached."""
    one_thread()
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=2)
    torch.manual_seed(42)
    x, y = fashion(args.data, "train")
    x, y = x[rank::2], y[rank::2]
    test_x, test_y = fashion(args.data, "t10k")
    net = nn.parallel.DistributedDataParallel(model(args.model))
    opt = torch.optim.SGD(net.parameters(), lr=0.02, momentum=0.9, nesterov=True)
    chosen = json.loads(args.zero_grad)[args.model]
    loss_fn = nn.CrossEntropyLoss()
    samples, next_eval, reached, stop = 0, args.eval_every, None, False
    steps_per_epoch = len(y) // args.batch
    steps_left = int(args.epochs * steps_per_epoch)
    dist.barrier()
    start = time.perf_counter()
    while steps_left > 0 and not stop:
        order = torch.randperm(len(y))
        for at in range(0, min(steps_left, steps_per_epoch) * args.batch, args.batch):
            steps_left -= 1
            pick = order[at:at + args.batch]
            clear(opt, chosen["zero_grad"])
            loss_fn(net(x[pick]), y[pick]).backward()
            opt.step()
            samples += 2 * args.batch
            if args.eval_every == 0 or samples < next_eval:
                continue
            next_eval += args.eval_every
            done = torch.zeros(1)
            if rank == 0:
                weights_at = time.perf_counter() - start
                with torch.no_grad():
                    accuracy = (net.module(test_x).argmax(1) == test_y).float().mean().item()
                if accuracy >= args.target:
                    reached = (weights_at, accuracy)
                    done[0] = 1
            dist.broadcast(done, 0)
            if done.item():
                stop = True
                break
    took = time.perf_counter() - start
    if rank == 0:
        print(json.dumps({"bench": "tta", "model": args.model, "target": args.target,
                          "samples": samples, "samples_per_s": samples / took,
                          "seconds": reached[0] if reached else None,
                          "accuracy": reached[1] if reached else None, **chosen}), flush=True)
    dist.destroy_process_group()


def halves(flat):
    """The two ps's parts of the parameters laid end to end: pstrain cuts its
    large variables into chunks spread over every ps, and whole tensors would
    leave the MLP's first weight, most of the model, on one ps alone."""
    half = (flat.numel() + 1) // 2
    return flat[:half].clone(), flat[half:].clone()  # clones: RPC sends a view's whole storage


class Shard:
    """One ps's part of the parameters and its optimizer's state (all
    elementwise, so a part steps as the whole would); pushes are applied one
    at a time in the order they arrive."""

    def __init__(self, preset, index):
        torch.manual_seed(42)  # both ps start from the same model's halves
        flat = nn.utils.parameters_to_vector(model(preset).parameters()).detach()
        self.weights = halves(flat)[index]
        self.opt = torch.optim.SGD([self.weights], lr=0.02, momentum=0.9, nesterov=True)
        self.lock = threading.Lock()
        self.samples, self.stop = 0, False

    def pull(self):
        with self.lock:
            return self.weights.clone()

    def push(self, grad, samples):
        with self.lock:
            self.weights.grad = grad
            self.opt.step()
            self.samples += samples
            return self.stop


SHARD = None  # this process's Shard, on ps0 and ps1
TRAIN = None  # this process's half of the training set, on the trainers


def shard_pull():
    return SHARD.pull()


def shard_push(grad, samples):
    return SHARD.push(grad, samples)


def load_weights(net, parts):
    """Puts the two ps's parts, as pulled, into net's parameters."""
    with torch.no_grad():
        nn.utils.vector_to_parameters(torch.cat(parts), net.parameters())


def rpc_train(preset, batch, epochs, way):
    """A trainer's whole run, called by ps0: pull from both ps, one step on
    the pulled weights, push each ps its part of the gradient; until the
    epochs are done or a push answers that the target is reached."""
    x, y = TRAIN
    net, loss_fn = model(preset), nn.CrossEntropyLoss()
    steps_per_epoch = len(y) // batch
    steps_left = int(epochs * steps_per_epoch)
    while steps_left > 0:
        order = torch.randperm(len(y))
        for at in range(0, min(steps_left, steps_per_epoch) * batch, batch):
            steps_left -= 1
            pulls = [rpc.rpc_async(f"ps{s}", shard_pull) for s in range(2)]
            load_weights(net, [f.wait() for f in pulls])
            pick = order[at:at + batch]
            clear(net, way)
            loss_fn(net(x[pick]), y[pick]).backward()
            grad = nn.utils.parameters_to_vector(p.grad for p in net.parameters())
            pushes = [rpc.rpc_async(f"ps{s}", shard_push, args=(part, batch))
                      for s, part in enumerate(halves(grad))]
            if any(f.wait() for f in pushes):
                return


def rpcps_rank(rank, store_file, args):
    """Ranks 0 and 1 are ps0 and ps1, 2 and 3 the trainers. ps0 starts both
    trainers, evaluates the weights every eval_every samples that ps0 has
    applied (both ps see every push) and prints the result."""
    global SHARD, TRAIN
    one_thread()
    names = ["ps0", "ps1", "trainer0", "trainer1"]
    if rank < 2:
        SHARD = Shard(args.model, rank)
    else:
        torch.manual_seed(42)
        x, y = fashion(args.data, "train")
        TRAIN = x[rank - 2::2], y[rank - 2::2]
    if rank == 0 and args.eval_every:
        test_x, test_y = fashion(args.data, "t10k")
        net = model(args.model)
    rpc.init_rpc(names[rank], rank=rank, world_size=4,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(
                     init_method=f"file://{store_file}"))
    if rank == 0:
        start = time.perf_counter()
        chosen = json.loads(args.zero_grad)[args.model]
        # timeout 0: a trainer's call lasts its whole run, past RPC's default.
        runs = [rpc.rpc_async(f"trainer{t}", rpc_train,
                              args=(args.model, args.batch, args.epochs, chosen["zero_grad"]),
                              timeout=0) for t in range(2)]
        next_eval, reached = args.eval_every, None
        while not all(f.done() for f in runs):
            if not args.eval_every or reached or SHARD.samples < next_eval:
                time.sleep(0.005)
                continue
            # A slow evaluation skips the crossings it missed instead of
            # queueing them: the time counted is that of the weights tested.
            next_eval += args.eval_every * ((SHARD.samples - next_eval) // args.eval_every + 1)
            weights_at = time.perf_counter() - start
            load_weights(net, [SHARD.pull(), rpc.rpc_sync("ps1", shard_pull)])
            with torch.no_grad():
                accuracy = (net(test_x).argmax(1) == test_y).float().mean().item()
            if accuracy >= args.target:
                reached = (weights_at, accuracy)
                SHARD.stop = True
        took = time.perf_counter() - start
        for f in runs:
            f.wait()  # a trainer's failure is this run's
        print(json.dumps({"bench": "rpcps", "model": args.model, "target": args.target,
                          "samples": SHARD.samples, "samples_per_s": SHARD.samples / took,
                          "seconds": reached[0] if reached else None,
                          "accuracy": reached[1] if reached else None, **chosen}), flush=True)
    rpc.shutdown()


def ranks(command, extra, n=2):
    """Runs `command` as ranks 0 to n-1 on one file store; rank 0's output is
    this process's."""
    import subprocess
    # RPC's transport listens on the interface of the host's name unless told:
    # the loopback keeps the peer on this machine whatever the host's setup.
    env = dict(os.environ, TP_SOCKET_IFNAME="lo")
    with tempfile.TemporaryDirectory() as tmp:
        common = extra + ["--store", os.path.join(tmp, "store")]
        procs = [subprocess.Popen([sys.executable, __file__, command, "--rank", str(r)] + common,
                                  stdout=None if r == 0 else subprocess.DEVNULL, env=env)
                 for r in range(n)]
        codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"bench_torch.py {command}: rank exit codes {codes}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compute")
    c.add_argument("--model", required=True)
    c.add_argument("--batch", type=int, default=64)
    c.add_argument("--windows", type=int, default=7)
    ways = ("best",) + ZERO_GRAD
    c.add_argument("--zero-grad", choices=ways, default="best")
    for name in ("ddp", "ddp-rank"):
        d = sub.add_parser(name)
        d.add_argument("--batch", type=int, default=64)
        d.add_argument("--steps", type=int, default=200)
        d.add_argument("--bucket-bytes", type=int, default=256 * 1024)
        if name == "ddp-rank":
            d.add_argument("--rank", type=int, required=True)
            d.add_argument("--store", required=True)
            d.add_argument("--zero-grad", required=True, help="JSON from resolve_zero_grad")
        else:
            d.add_argument("--zero-grad", choices=ways, default="best")
    for name in ("tta", "tta-rank", "rpcps", "rpcps-rank"):
        t = sub.add_parser(name)
        t.add_argument("--data", required=True)
        t.add_argument("--model", default="mlp")
        t.add_argument("--target", type=float, default=0.85)
        t.add_argument("--epochs", type=float, default=3)
        t.add_argument("--batch", type=int, default=64)
        t.add_argument("--eval-every", type=int, default=30000)
        if name.endswith("-rank"):
            t.add_argument("--rank", type=int, required=True)
            t.add_argument("--store", required=True)
            t.add_argument("--zero-grad", required=True, help="JSON from resolve_zero_grad")
        else:
            t.add_argument("--zero-grad", choices=ways, default="best")
    args = parser.parse_args()
    if args.command == "compute":
        compute(args)
    elif args.command == "ddp":
        one_thread()
        chosen = resolve_zero_grad(args.zero_grad, ("mlp", "cnn"), args.batch)
        ranks("ddp-rank", ["--batch", str(args.batch), "--steps", str(args.steps),
                           "--bucket-bytes", str(args.bucket_bytes),
                           "--zero-grad", json.dumps(chosen)])
    elif args.command in ("tta", "rpcps"):
        one_thread()
        chosen = resolve_zero_grad(args.zero_grad, (args.model,), args.batch)
        ranks(args.command + "-rank", ["--data", args.data, "--model", args.model,
                                       "--target", str(args.target),
                                       "--epochs", str(args.epochs), "--batch", str(args.batch),
                                       "--eval-every", str(args.eval_every),
                                       "--zero-grad", json.dumps(chosen)],
              n=2 if args.command == "tta" else 4)
    elif args.command == "ddp-rank":
        ddp_rank(args.rank, args.store, args)
    elif args.command == "tta-rank":
        tta_rank(args.rank, args.store, args)
    else:
        rpcps_rank(args.rank, args.store, args)


if __name__ == "__main__":
    main()
