# The d3ray image: Ray 2.60 on Python 3.11 with CUDA 12.8, torch's CUDA 12.8 build, DeepSpeed, and d3ray
# with its cloud extra (s3fs, gcsfs). Used by the KubeRay manifests (k8s/); runs on GPU nodes whose
# NVIDIA driver is >= 570 (CUDA 12.8), and on CPU nodes.
#
#   docker build -t registry.example.com/d3ray:0.1.0 .      # from the repository root
#   docker push registry.example.com/d3ray:0.1.0            # then set this image in k8s/*.yaml
#
# Every version comes from the lock (uv.lock): torch at the lock's version from PyTorch's CUDA 12.8 index,
# then requirements/node.txt (exported from uv.lock, hashed: Ray, DeepSpeed, transformers, the cloud
# extra, ...), then d3ray without dependencies. Not built in this repository's CI (no container engine
# there); tests/unit/test_k8s_manifests.py checks the base image's Ray, the torch pin and the manifests
# against the lock.
FROM rayproject/ray:2.60.0-py311-cu128

# torch first, from PyTorch's CUDA 12.8 index (PyPI's build of 2.13.0 targets CUDA 13, driver >= 580),
# then the rest of the lock, as on the launcher clusters (cluster.yaml setup_commands)
COPY --chown=ray:users requirements/node.txt /tmp/node.txt
RUN pip install --no-cache-dir "torch==2.13.0" --index-url https://download.pytorch.org/whl/cu128 \
 && pip install --no-cache-dir -r /tmp/node.txt

# d3ray itself, with the job entry points and configs: RayJob's working_dir is this folder
WORKDIR /home/ray/d3ray
COPY --chown=ray:users pyproject.toml README.md setup.sh ./
COPY --chown=ray:users d3ray ./d3ray
COPY --chown=ray:users jobs ./jobs
COPY --chown=ray:users tune_configs ./tune_configs
RUN pip install --no-cache-dir --no-deps . \
 && python -c "import d3ray, torch, ray, deepspeed, s3fs; print('d3ray', d3ray.__version__, 'torch', torch.__version__, 'ray', ray.__version__)"
