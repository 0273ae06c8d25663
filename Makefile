# mmcurate developer targets. `make demo` and `make test` install first when needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Debian's Chromium + ChromeDriver render the demo report in tests/project/test_demo.py.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
INSTALL_CHROMIUM := ($(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium chromium-driver >/dev/null) \
	|| echo "warning: could not install chromium chromium-driver; the report browser test will fail"

.PHONY: install demo test lint bench clean

# Bytecode as a wheel install writes it: with PYTHONDONTWRITEBYTECODE set, an editable
# install would otherwise compile every module on every command (~0.3 s). Quick when fresh.
install: $(STAMP)
	$(BIN)/python -m compileall -q mmcurate core pipeline stages trainer >/dev/null

# torch/torchvision are installed first with exact pins: on machines with a local wheel cache
# this avoids resolving a different (multi-GB) build through open_clip's loose requirement.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "torch==2.14.1" "torchvision==0.29.1" || $(BIN)/pip install -q torch torchvision
	$(BIN)/pip install -q -e ".[test,demo]"
	# text_area reads PP-OCRv4's detector file from this wheel; --no-deps: its requirements
	# would replace the headless OpenCV with opencv-python.
	$(BIN)/pip install -q --no-deps "rapidocr-onnxruntime==1.4.4"
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || $(INSTALL_CHROMIUM)
	command -v strace >/dev/null || ($(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq strace >/dev/null) \
		|| echo "warning: could not install strace; tests/project/test_no_cloud_probe.py will fail"
	touch $(STAMP)

demo: install
	$(BIN)/mmcurate demo --out demo-output

test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -x -q --durations=25

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# bench/ingest.py needs nginx (apt-get install -y nginx) and installs img2dataset in its own venv.
bench: install
	$(BIN)/python bench/build_images.py
	$(BIN)/python bench/ingest.py --n 5000 --rounds 2

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
