set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src
nvidia-smi --query-gpu=name,driver_version --format=csv
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 0 tests/cuda/test_conv_engines_gpu.py -k "weight_grad-f3232x8x6x6 or lowering_runs" --tb=short -x 2>&1 | grep -v "^Forward Spec\|^Data Spec\|^Weight Spec" | tail -60
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 0 tests/cuda/test_precision_gpu.py tests/cuda/test_exact_mode_gpu.py --tb=short 2>&1 | tail -15
python3 .scratch/int8_probe.py
