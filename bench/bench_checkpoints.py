"""Checkpoint write and read throughput, against `cp` on local disk and against boto3's own
transfer manager on an S3 server.

    python bench/bench_checkpoints.py [--gib 1.0] [--repeats 3] [--no-local] [--no-s3] [--smoke]

Local: `write_checkpoint` (which fsyncs every file and the directory) and `read_checkpoint`
(which verifies every SHA-256) of about 1 GiB of float32 tensors, against `cp` of the same
bytes, and against `cp` followed by `sync` of the copy, the like-for-like durable copy.
Reads are from the page cache, as cp's are. Ratios are our time over the peer's (goal:
within 1.5x of cp). Each figure is the best of the repeats, taken in turn
with its peers, each after an os.sync().

S3: the same checkpoint through a moto server on the loopback address, against boto3's
`upload_file` / `download_file` of the same bytes on the same server, once each. moto keeps objects in
its own Python process, so these figures measure the client's overhead against boto3's more
than they measure S3.

--smoke: two tensors of 1 MiB, once each (bench/smoke.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import smoke
from sexpgpu.store import read_checkpoint, write_checkpoint

ROOT = Path(__file__).resolve().parents[1]
TENSOR_BYTES = 64 * 1024 * 1024
SMOKE_TENSOR_BYTES = 1024 * 1024


def make_tensors(gib: float, tensor_bytes: int = TENSOR_BYTES) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    count = max(1, round(gib * (1 << 30) / tensor_bytes))
    return {f"param/layer{i:02d}/w": rng.standard_normal(tensor_bytes // 4, dtype=np.float32) for i in range(count)}


def seconds(action) -> float:
    os.sync()  # start each measurement with no dirty pages left by the one before
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def local_figures(tensors, repeats: int, where: str) -> None:
    nbytes = sum(a.nbytes for a in tensors.values())
    work = tempfile.mkdtemp(prefix="bench-ckpt-", dir=where)
    root, copy = os.path.join(work, "run"), os.path.join(work, "copy.safetensors")
    source = os.path.join(root, "step-1", "model.safetensors")
    times: dict[str, list[float]] = {"write": [], "read": [], "cp": [], "cp_sync": []}
    try:
        for _ in range(repeats):  # interleaved, so that the machine's load falls on both alike
            shutil.rmtree(root, ignore_errors=True)
            times["write"].append(seconds(lambda: write_checkpoint(root, 1, tensors, {})))
            times["read"].append(seconds(lambda: read_checkpoint(os.path.join(root, "step-1"))))
            times["cp"].append(seconds(lambda: subprocess.run(["cp", source, copy], check=True)))
            os.remove(copy)
            times["cp_sync"].append(seconds(lambda: subprocess.run(["sh", "-c", f"cp {source} {copy} && sync {copy}"],
                                                                   check=True)))
            os.remove(copy)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    best = {name: min(values) for name, values in times.items()}
    report(f"local disk ({where}), {nbytes / 2**30:.2f} GiB in {len(tensors)} tensors, best of {repeats}:", nbytes,
           {"write_checkpoint (fsync)": best["write"], "read_checkpoint (verify)": best["read"],
            "cp": best["cp"], "cp + sync": best["cp_sync"]},
           [("write / cp", "write_checkpoint (fsync)", "cp"), ("write / (cp + sync)", "write_checkpoint (fsync)", "cp + sync"),
            ("read / cp", "read_checkpoint (verify)", "cp")])


def s3_figures(tensors, where: str) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from s3server import S3Server

    nbytes = sum(a.nbytes for a in tensors.values())
    server = S3Server.start()
    work = tempfile.mkdtemp(prefix="bench-ckpt-", dir=where)
    try:
        os.environ.update(server.environment())
        bucket = server.new_bucket()
        client = server.client()
        root = f"s3://{bucket}/run"
        source = os.path.join(write_checkpoint(os.path.join(work, "run"), 1, tensors, {}), "model.safetensors")
        write = seconds(lambda: write_checkpoint(root, 1, tensors, {}))
        upload = seconds(lambda: client.upload_file(source, bucket, "peer/model.safetensors"))
        read = seconds(lambda: read_checkpoint(f"{root}/step-1"))
        download = seconds(lambda: client.download_file(bucket, "peer/model.safetensors", os.path.join(work, "down")))
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    report(f"S3 (moto server on 127.0.0.1), {nbytes / 2**30:.2f} GiB:", nbytes,
           {"write_checkpoint": write, "read_checkpoint (verify)": read,
            "boto3 upload_file": upload, "boto3 download_file": download},
           [("write / upload_file", "write_checkpoint", "boto3 upload_file"),
            ("read / download_file", "read_checkpoint (verify)", "boto3 download_file")])


def report(title: str, nbytes: int, times: dict[str, float], ratios) -> None:
    print(title)
    for label, taken in times.items():
        print(f"  {label:<26}{taken:7.3f} s  {nbytes / taken / 2**20:8.0f} MiB/s")
    for label, ours, peer in ratios:
        print(f"  ratio {label:<21}{times[ours] / times[peer]:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-s3", action="store_true")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the local files go")
    parser.add_argument("--no-local", action="store_true")
    smoke.add_option(parser)
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    if args.smoke:
        args.gib, args.repeats = 2 * SMOKE_TENSOR_BYTES / 2**30, 1
    tensors = make_tensors(args.gib, SMOKE_TENSOR_BYTES if args.smoke else TENSOR_BYTES)
    if not args.no_local:
        local_figures(tensors, args.repeats, args.dir)
    if not args.no_s3:
        s3_figures(tensors, args.dir)


if __name__ == "__main__":
    main()
