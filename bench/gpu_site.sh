# Sourced by the device-call scripts (bench/gpu_call.sh, bench/gpu_e2e.sh), repository root: the GPU host's
# environment. Unpacks the site packages the image lacks (.gpu-site/site.tgz, carried) once per machine;
# site.txz instead: the same packed with xz (tar cJf), 9 MB smaller, which leaves room for more in one carry.
# Never let a process use NVLink multicast (it can take the host's shared GPUs down).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# A wheel unpacked by hand keeps its data files under <name>.data/data/ (pip would install them under the
# prefix): nbconvert's HTML templates must be in share/jupyter for JUPYTER_PATH to find them.
if [ ! -f /tmp/site/.unpacked ]; then
  site=$(ls .gpu-site/site.tgz .gpu-site/site.txz 2>/dev/null | head -n 1)
  mkdir -p /tmp/site && tar xf "${site:-.gpu-site/site.tgz}" -C /tmp/site || exit 1
  for data in /tmp/site/*.data/data/share/jupyter; do cp -r "$data/." /tmp/site/share/jupyter/; done
  touch /tmp/site/.unpacked
fi
export PYTHONPATH=/tmp/site JUPYTER_PATH=/tmp/site/share/jupyter
