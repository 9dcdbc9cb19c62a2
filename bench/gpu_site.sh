# Sourced by the device-call scripts (bench/gpu_call.sh, bench/gpu_e2e.sh), repository root: the GPU host's
# environment. Unpacks the site packages the image lacks (.gpu-site/site.tgz, carried) once per machine.
# Never let a process use NVLink multicast (it can take the host's shared GPUs down).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ ! -f /tmp/site/.unpacked ]; then
  mkdir -p /tmp/site && tar xzf .gpu-site/site.tgz -C /tmp/site && touch /tmp/site/.unpacked || exit 1
fi
export PYTHONPATH=/tmp/site JUPYTER_PATH=/tmp/site/share/jupyter
