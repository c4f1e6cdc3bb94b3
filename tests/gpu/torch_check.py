"""torch_check.py - vLLM's GPU path with real CUDA tensors, through the Mooncake drop-in.

Run by hand on a machine with a GPU and PyTorch (not part of `make test`):

    python3 tests/gpu/torch_check.py --kvpoold build/bin/kvpoold [--lib build/lib/libkvpool.so]

Starts kvpoold, makes a KV cache as vLLM's connector sees it (one CUDA tensor per layer,
registered with register_buffer), puts blocks with batch_put_from_multi_buffers (one device
address per layer and key) and gets them into another cache with batch_get_into_multi_buffers,
checks them with torch.equal, and prints GB/s (best of --reps), twice, side by side: by direct
DMA into the node's segments (the default) and through pinned staging buffers
(KVPOOL_DEVICE_DMA=staged), each in a process of its own (--mode runs one). KVPOOL_CUDART is left unset:
libkvpool must find PyTorch's own CUDA runtime in the process by itself.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def start_kvpoold(path, segment):
    ready = os.path.join(tempfile.mkdtemp(prefix="kvpool-torch-check-"), "ready")
    proc = subprocess.Popen([path, "--endpoint", "tcp://127.0.0.1:*", "--admin",
                             "tcp://127.0.0.1:*", "--segment-size", segment, "--ready-file",
                             ready, "--metrics-port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 20
    while not os.path.exists(ready):
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit("kvpoold did not start")
        time.sleep(0.05)
    with open(ready) as f:
        endpoints = [line.strip().split("=", 1)[1] for line in f
                     if line.startswith("endpoint=tcp://")]
    return proc, endpoints[0]


def both(args):
    """Runs each pass in a child process and prints their ratio."""
    figures = {}
    for mode in ("direct", "staged"):
        argv = [sys.executable, os.path.abspath(__file__), "--mode", mode]
        for name, value in vars(args).items():
            if name != "mode" and value is not None:
                argv += ["--" + name.replace("_", "-"), str(value)]
        out = subprocess.run(argv, stdout=subprocess.PIPE, text=True)
        for line in out.stdout.splitlines():
            if line.startswith("FIGURES "):
                _, _, put, get = line.split()
                figures[mode] = (float(put), float(get))
            else:
                print(line, flush=True)
        if out.returncode != 0:
            raise SystemExit("torch_check: the %s pass failed (status %d)" % (mode, out.returncode))
    print("direct / staged: put %.2fx, get %.2fx" %
          (figures["direct"][0] / figures["staged"][0],
           figures["direct"][1] / figures["staged"][1]))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kvpoold", required=True)
    parser.add_argument("--lib", help="libkvpool.so (default: the package's search)")
    parser.add_argument("--python", default=os.path.join(HERE, "..", "..", "python"),
                        help="folder holding the kvpool package")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--blocks", type=int, default=1024)
    parser.add_argument("--block-kib", type=int, default=32, help="one layer's block, KiB")
    parser.add_argument("--keys", type=int, default=512)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--mode", choices=("direct", "staged"),
                        help="one pass, in this process (default: both, each in a child)")
    args = parser.parse_args()
    if args.mode is None:
        both(args)
        return
    if args.lib:
        os.environ["KVPOOL_LIB"] = os.path.abspath(args.lib)
    os.environ.pop("KVPOOL_CUDART", None)
    sys.path.insert(0, os.path.abspath(args.python))

    import torch
    from kvpool.mooncake import MooncakeDistributedStore

    block = args.block_kib << 10
    total = args.layers * args.blocks * block
    proc, endpoint = start_kvpoold(args.kvpoold, "%dMiB" % (2 * total // (1 << 20) + 64))
    try:
        elements = block // 2
        source = [torch.randn(args.blocks, elements, device="cuda", dtype=torch.float16)
                  for _ in range(args.layers)]
        target = [torch.zeros_like(t) for t in source]
        torch.cuda.synchronize()
        keys = ["torch-block-%d" % b for b in range(args.keys)]
        ptrs = [[t[b].data_ptr() for t in source] for b in range(args.keys)]
        back = [[t[args.blocks - 1 - b].data_ptr() for t in target] for b in range(args.keys)]
        sizes = [[block] * args.layers for _ in range(args.keys)]
        moved = args.keys * args.layers * block
        os.environ["KVPOOL_DEVICE_DMA"] = args.mode
        store = MooncakeDistributedStore()
        assert store.setup("localhost", "", 0, 16 << 20, "tcp", "",
                           endpoint[len("tcp://"):]) == 0
        for t in source + target:
            assert store.register_buffer(t.data_ptr(), t.numel() * t.element_size()) == 0
        best_put = best_get = 0.0
        for rep in range(args.reps):
            store.remove_all(True)
            for t in target:
                t.zero_()
            torch.cuda.synchronize()
            start = time.perf_counter()
            put = store.batch_put_from_multi_buffers(keys, ptrs, sizes)
            put_s = time.perf_counter() - start
            assert put == [0] * len(keys), put[:4]
            start = time.perf_counter()
            got = store.batch_get_into_multi_buffers(keys, back, sizes)
            get_s = time.perf_counter() - start
            assert got == [args.layers * block] * len(keys), got[:4]
            best_put = max(best_put, moved / put_s / 1e9)
            best_get = max(best_get, moved / get_s / 1e9)
        for b in range(args.keys):
            for s, t in zip(source, target):
                assert torch.equal(s[b], t[args.blocks - 1 - b]), "block %d differs" % b
        store.remove_all(True)
        store.close()
        print("torch %s, %s: %d keys x %d layers x %d KiB from and into CUDA tensors, %s: "
              "put %.1f GB/s, get %.1f GB/s, every block equal" %
              (torch.__version__, torch.cuda.get_device_name(), args.keys, args.layers,
               args.block_kib, args.mode, best_put, best_get), flush=True)
        print("FIGURES %s %.3f %.3f" % (args.mode, best_put, best_get), flush=True)
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
