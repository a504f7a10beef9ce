# lorafleet images, one target per kind of process (docs/compose.md):
#   slim  the frontend and the `mocker` worker: no torch
#   hf    the `hf` worker (transformers + peft, CPU torch) and the demo model builder
#   vllm  the `vllm` worker for NVIDIA GPUs
# compose.yaml builds them; by hand: `docker build --target hf -t lorafleet:hf .`
# Dependencies install in layers built from pyproject.toml alone, so that a code
# change reinstalls only lorafleet itself.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DYN_LORA_PATH=/data/cache/loras \
    HF_HOME=/data/cache/huggingface
# Volumes mounted on /data/* start with this ownership, so the processes run unprivileged.
RUN useradd --create-home --uid 1000 --user-group lorafleet \
 && mkdir -p /data/adapters /data/cache /data/secrets /data/metrics \
 && chown -R lorafleet:lorafleet /data
COPY pyproject.toml scripts/pyproject_requirements.py /tmp/deps/
WORKDIR /app

FROM base AS slim-deps
RUN cd /tmp/deps && python pyproject_requirements.py --base s3 > requirements.txt \
 && pip install -r requirements.txt

FROM slim-deps AS hf-deps
# PyPI's default torch build carries CUDA (gigabytes); the CPU build lives on PyTorch's
# index. An empty TORCH_INDEX_URL leaves pip with its own configuration.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN cd /tmp/deps && python pyproject_requirements.py hf > requirements.txt \
 && pip install ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} -r requirements.txt

FROM slim-deps AS vllm-deps
# Triton compiles its small launchers with the system C compiler when vLLM starts.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/* \
 && cd /tmp/deps && python pyproject_requirements.py vllm > requirements.txt \
 && pip install -r requirements.txt

FROM slim-deps AS slim
COPY . /app
RUN pip install --no-deps /app
USER lorafleet
CMD ["python", "-m", "lorafleet.frontend"]

FROM hf-deps AS hf
COPY . /app
RUN pip install --no-deps /app
USER lorafleet
CMD ["python", "-m", "lorafleet.worker"]

FROM vllm-deps AS vllm
COPY . /app
RUN pip install --no-deps /app
USER lorafleet
CMD ["python", "-m", "lorafleet.worker"]

# compose.secure.yaml's one-shot etcd-auth service: lorafleet/launch/etcd_auth_job.py drives etcdctl,
# taken from the etcd image (which has no shell to run the steps itself).
FROM quay.io/coreos/etcd:v3.5.17 AS etcd-image

FROM slim AS etcd-auth
COPY --from=etcd-image /usr/local/bin/etcdctl /usr/local/bin/etcdctl
CMD ["python", "-m", "lorafleet.launch.etcd_auth_job"]
