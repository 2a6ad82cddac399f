"""Run by the crash and disk-full tests as a subprocess: write checkpoints, then exit.

    python checkpoint_child.py ROOT FIRST LAST [BIG_BYTES [KEEP]]

writes the sample checkpoints for steps FIRST..LAST to ROOT (a directory or s3:// prefix).
The store's test seam (SEXPGPU_TEST_CHECKPOINT_KILL_AT / _SLEEP) may kill it on the way.
A SexpgpuError is printed and exits with status 2, as the command line does.
"""

import os
import subprocess
import sys
from pathlib import Path

from store_samples import BF16, sample_record, sample_tensors

from sexpgpu.errors import SexpgpuError
from sexpgpu.store import write_checkpoint


def main(root: str, first: int, last: int, big_bytes: int = 0, keep: int = 0) -> int:
    try:
        for step in range(first, last + 1):
            write_checkpoint(root, step, sample_tensors(step, big_bytes), sample_record(step), keep=keep or None, bf16=BF16)
            print(f"committed {step}", flush=True)
    except SexpgpuError as error:
        print(error.render(), file=sys.stderr)
        return 2
    return 0


def spawn(root, first: int, last: int, big_bytes: int = 0, keep: int = 0, env=None, file_limit=None) -> subprocess.Popen:
    """Start this script; `env` adds variables, `file_limit` caps the size of any file it writes."""
    import sexpgpu

    src = str(Path(sexpgpu.__file__).resolve().parents[1])
    here = str(Path(__file__).resolve().parent)
    environment = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join([here, src])}

    def limit_files():  # Python ignores SIGXFSZ, so a write past the limit fails with EFBIG
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))

    return subprocess.Popen([sys.executable, __file__, str(root), str(first), str(last), str(big_bytes), str(keep)],
                            env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=limit_files if file_limit else None)


def run(*args, **kwargs) -> subprocess.CompletedProcess:
    process = spawn(*args, **kwargs)
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], *map(int, sys.argv[2:])))
