# powerd: `make demo` runs the whole loop on this machine; `make test` runs ruff, mypy and
# every test (and installs the core alone at its minimum pins in a throwaway venv:
# tests/support/lean_install.py). Tests run four at a time, the `realtime` ones alone after.
# Both create the virtual environment; `make test` also installs the Debian
# programs the tests start (DEB_NEEDS: mosquitto, InfluxDB, VictoriaMetrics, Prometheus,
# Alertmanager, systemd-analyze, faketime) when they are missing.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Debian packages the test suite needs, as "command:package" pairs.
DEB_NEEDS := mosquitto:mosquitto systemd-analyze:systemd victoria-metrics:victoria-metrics influxd:influxdb faketime:faketime promtool:prometheus prometheus-alertmanager:prometheus-alertmanager

.PHONY: demo test lint format bench deps venv clean

demo: venv
	$(BIN)/powerd demo

test: deps venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@# the lean install waits on pip while mypy works: side by side (beside the tests they
	@# took as long: mypy is a core's work)
	@$(BIN)/python tests/support/lean_install.py > $(VENV)/lean_install.log 2>&1 & lean=$$!; \
	  $(BIN)/mypy && $(BIN)/mypy --strict powerd planner policies; typed=$$?; \
	  wait $$lean; installed=$$?; \
	  if [ $$installed = 0 ]; then grep '^lean install' $(VENV)/lean_install.log; \
	  else cat $(VENV)/lean_install.log; fi; \
	  [ $$typed = 0 ] && [ $$installed = 0 ]
	@# most tests wait on brokers and processes (three at a time used 1.3 of 2 cores, four 1.6),
	@# so four run at a time; those that assert on wall-clock pacing (realtime) then two at a
	@# time (they used 0.4 of 2 cores so: 257 s against 364 s one at a time, all passing)
	$(BIN)/pytest -q -n 4 --dist loadfile -m "not realtime" --durations=10
	$(BIN)/pytest -q -n 2 --dist loadfile -m realtime --durations=15

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/mypy --strict powerd planner policies

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: venv
	$(BIN)/python -m bench.bench_agent --seconds 60 --json bench/results/agent.json
	$(BIN)/python -m bench.bench_policy --safety bands --json bench/results/policy.json
	$(BIN)/python -m bench.bench_policy --safety caps --json bench/results/policy-caps.json
	$(BIN)/python -m bench.bench_controller --cycles 10 --json bench/results/controller.json
	$(BIN)/python -m bench.bench_controller --cycles 10 --fine-every-s 10 --json bench/results/controller-fine10.json
	$(BIN)/python -m bench.bench_planner --whatif-s 60 --json bench/results/planner.json
	$(BIN)/python -m bench.bench_scale --overload --safety bands --json bench/results/scale.json
	$(BIN)/python -m bench.bench_scale --nodes 20736 --no-bare --verify-every 16 --site-limit-mw 110 --window-s 60 --site-limit-for-s 30 --safety bands --json bench/results/scale-demand-response.json
	$(BIN)/python -m bench.bench_scale --nodes 20736 --jobs 2 --verify-every 16 --warmup-s 90 --safety caps --json bench/results/scale-jobs2-caps-v16-warm90.json
	$(BIN)/python -m bench.bench_commands --seconds 120 --safety bands --json bench/results/commands-jobs2.json
	$(BIN)/python -m bench.bench_tree --site-rows 16,8 --json bench/results/tree.json
	$(BIN)/python -m bench.bench_grid --json bench/results/grid.json
	$(BIN)/python -m bench.bench_clock_policy --clock-mhz 1100 --clock-mhz 1811 --json bench/results/clock_policy.json
	$(BIN)/python -m bench.fuzz --payloads 100000 --seed 1 --json bench/results/fuzz.json
	$(BIN)/python -m bench.bench_ingest --json bench/results/ingest.json
	$(BIN)/python -m bench.bench_ddp_hook --json bench/results/ddp_hook.json

deps:
	@missing=""; \
	for need in $(DEB_NEEDS); do \
	  cmd=$${need%%:*}; pkg=$${need##*:}; \
	  command -v $$cmd >/dev/null 2>&1 || [ -x /usr/sbin/$$cmd ] || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@# Debian's python3 ships venv/ensurepip separately
	@$(PYTHON) -c "import ensurepip, venv" 2>/dev/null || { \
	  echo "installing Debian package python3-venv"; \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[all,torch,test]'
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis
