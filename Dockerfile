# The d3ray image: Ray 2.60 on Python 3.11 with CUDA 12.8, torch's CUDA 12.8 build, DeepSpeed, and d3ray
# with its cloud extra (s3fs, gcsfs). Used by the KubeRay manifests (k8s/); runs on GPU nodes whose
# NVIDIA driver is >= 570 (CUDA 12.8), and on CPU nodes.
#
#   docker build -t registry.example.com/d3ray:0.1.0 .      # from the repository root
#   docker push registry.example.com/d3ray:0.1.0            # then set this image in k8s/*.yaml
#
# Not built in this repository's CI (no container engine there); tests/unit/test_k8s_manifests.py
# checks that its pins match cluster.yaml's and the manifests'.
FROM rayproject/ray:2.60.0-py311-cu128

# torch first, from PyTorch's CUDA 12.8 index (PyPI's default build may target another CUDA), then the
# Ray extras and DeepSpeed pinned as on the launcher clusters (cluster.yaml setup_commands)
RUN pip install --no-cache-dir "torch==2.13.0" --index-url https://download.pytorch.org/whl/cu128 \
 && pip install --no-cache-dir "ray[default,train,data,tune]==2.60.0" "deepspeed==0.19.8"

# d3ray itself, with the job entry points and configs: RayJob's working_dir is this folder
WORKDIR /home/ray/d3ray
COPY --chown=ray:users pyproject.toml README.md setup.sh ./
COPY --chown=ray:users d3ray ./d3ray
COPY --chown=ray:users jobs ./jobs
COPY --chown=ray:users tune_configs ./tune_configs
RUN pip install --no-cache-dir ".[cloud]" \
 && python -c "import d3ray, torch, ray, deepspeed, s3fs; print('d3ray', d3ray.__version__, 'torch', torch.__version__, 'ray', ray.__version__)"
