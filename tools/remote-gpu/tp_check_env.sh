# Sourced by the tensor-parallel GPU checks (tp_in_place_check.sh, tp_draft_check.sh) after they
# set `dir` (their output folder, made) and `budget` (their default seconds; BUDGET overrides):
# the workers' environment, PY, `left` / `cap` (a step's limit cut to the time left), the
# package installed where PY lacks it, and the device line in $dir/device.txt.
# PYTHONSAFEPATH: the TP workers (`python -m jetspec_chat.engine.tp_launcher`) must import the
# package PY imports, not the tree's jetspec_chat/ source folder from the current directory.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 JETSPEC_TP_STACKS=1 PYTHONSAFEPATH=1
PY=${PY:-python3}
start=$SECONDS
left() { echo $((${BUDGET:-$budget} - (SECONDS - start))); }
cap() { local l; l=$(left); [ "$l" -lt "$1" ] && echo $((l > 5 ? l - 5 : 1)) || echo "$1"; }

$PY -c "import jetspec_chat.engine.parallel" 2>/dev/null \
  || $PY -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
  || { echo "install failed"; exit 9; }
$PY -c "import torch, triton; print(torch.cuda.get_device_name(), torch.cuda.device_count(), 'GPUs, torch', torch.__version__, 'triton', triton.__version__)" \
  | tee "$dir/device.txt"
