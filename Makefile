# The README's two commands: `make run` (the default study) and `make test` (what CI runs).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOROVOD := $(VENV)/.horovod

# Snakemake imports its SLURM plugin at every start, and the plugin runs `scontrol show config`:
# ~9 s wherever a SLURM client is configured but no controller answers (this machine once the
# local test cluster is stopped). Local runs, lint and dry-runs need no controller, so they get
# one that refuses at once (scripts/slurm-offline.conf; tests/conftest.py does the same for the
# tests). Inside a SLURM job (SLURM_JOB_ID set) the job's own configuration is kept.
NO_SLURM := $(if $(SLURM_JOB_ID),,SLURM_CONF=$(CURDIR)/scripts/slurm-offline.conf)

.PHONY: run test setup horovod bytecode lint dryrun pytest pytest-parallel pytest-alone bench gpu-check clean slurm-profile slurm-start slurm-stop

# Horovod is built by the workflow's `horovod` rule, only where the study has a Horovod cell and
# the venv lacks it, with every core and before any run (workflow/rules/train.smk).
run: $(STAMP) bytecode
	$(NO_SLURM) $(BIN)/snakemake

# Each phase timed, the times printed at the end (pass or fail). The tree's `git status` must be
# the same after as before: a test that writes beside the sources fails `make test`.
TEST_PHASES := setup horovod lint dryrun pytest-parallel pytest-alone
test:
	@before=$$(git status --porcelain 2>/dev/null); times=""; status=0; \
	for phase in $(TEST_PHASES); do start=$$(date +%s); \
	  $(MAKE) --no-print-directory $$phase || status=$$?; \
	  times="$$times $$phase $$(( $$(date +%s) - start ))s"; [ $$status = 0 ] || break; done; \
	after=$$(git status --porcelain 2>/dev/null); \
	if [ $$status = 0 ] && [ "$$before" != "$$after" ]; then status=1; \
	  echo "make test left files in the tree (git status --porcelain, before vs after):"; \
	  diff <(echo "$$before") <(echo "$$after"); fi; \
	echo "make test phases:$$times"; exit $$status

# Pinned environment in .venv/: installed by uv where it can, pip otherwise, with the same pins
# and pip's own find-links/constraints (torch==2.13.0 comes from the local CPU wheel); see
# scripts/install-requirements.sh. Horovod is not part of it: `make horovod`, or the workflow
# builds it for a study that has a Horovod cell.
setup: $(STAMP) bytecode
$(STAMP): requirements.txt pyproject.toml scripts/install-requirements.sh
	PYTHON=$(PY) scripts/install-requirements.sh $(VENV)
	touch $@

# The package's bytecode, written now: where PYTHONDONTWRITEBYTECODE is set (many containers,
# this project's machines) Python never writes it, and every report, Snakemake start and run
# compiled trainscale's modules again (~0.3 s each). Stale files are recompiled (~0.1 s).
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q workflow/trainscale

# Horovod 0.28.1 built from its sdist with the project's edits, on every core (about 7 min on 2;
# the wheel is cached in .cache/horovod, so a rebuild of .venv only reinstalls it). The tests
# need it; `make run` leaves it to the workflow. See scripts/build-horovod.sh.
horovod: $(HOROVOD)
$(HOROVOD): $(STAMP) scripts/build-horovod.sh
	scripts/build-horovod.sh $(BIN)/python
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check workflow tests benchmarks
	# the package's stages import only the stages below them, and no module imports in a circle
	cd workflow && ../$(BIN)/lint-imports --config ../pyproject.toml --no-cache
	$(BIN)/ruff format --check workflow tests benchmarks
	$(BIN)/snakefmt --check Snakefile workflow
	$(NO_SLURM) $(BIN)/snakemake --lint

dryrun: $(STAMP) bytecode
	$(NO_SLURM) $(BIN)/snakemake -n --quiet rules
	# .test/imagedata.yaml reads the bundled digits exported as JPEG folders and shards
	$(NO_SLURM) $(BIN)/snakemake export_data --cores 1 --configfile .test/config.yaml --quiet rules
	for c in .test/*.yaml; do $(NO_SLURM) $(BIN)/snakemake -n --quiet rules --configfile $$c || exit 1; done

# Two pytest-xdist workers: together they kept 1.9 of 2 cores busy (user+sys CPU over the
# phase's wall time, measured alone). A study's tests stay in one worker (loadgroup).
# Beside them, in a process of their own, the SLURM tests: their jobs keep ~0.8 of 2 cores
# busy (sbatch, sacct polled every 2 s, job starts), and alone they took 10 of CI's 51 minutes.
# Their output is printed after the workers'. The tests marked `alone` run after both, with
# nothing beside them: the compare tests' planted 2x slowdown must stand out of 2 repeats'
# run-to-run spread, which beside another test's training reached a factor of 1.5 (a 95% CI of
# [0.43, 2.31] on a copy), and the loader processes' cut of the data wait needs a free core for
# the processes (beside the other worker's training it measured 0.63x against a 0.6x bar).
# ALONE lists the files that hold them (tests/test_xdist_groups.py checks the list is whole).
PYTEST_WORKERS ?= 2
SLURM_TESTS := tests/test_slurm.py tests/test_slurm_affinity.py tests/test_slurm_containers.py
ALONE := tests/test_compare.py tests/test_imagedata.py tests/test_imagedata_training.py
pytest:
	$(MAKE) --no-print-directory pytest-parallel
	$(MAKE) --no-print-directory pytest-alone
pytest-parallel: $(STAMP) $(HOROVOD) bytecode
	@slurm_log=$$(mktemp); \
	$(BIN)/python -m pytest -q -rs --durations=5 $(SLURM_TESTS) $(PYTEST_ARGS) \
	  > $$slurm_log 2>&1 & \
	slurm=$$!; \
	$(BIN)/python -m pytest -q -rs --durations=25 -n $(PYTEST_WORKERS) --dist loadgroup \
	  $(addprefix --ignore=,$(SLURM_TESTS)) -m "not alone" $(PYTEST_ARGS); \
	status=$$?; wait $$slurm; slurm_status=$$?; \
	echo "--- the SLURM tests, run beside the above:"; cat $$slurm_log; rm -f $$slurm_log; \
	[ $$status = 0 ] && [ $$slurm_status = 0 ]
pytest-alone: $(STAMP) $(HOROVOD) bytecode
	$(BIN)/python -m pytest -q -rs --durations=5 -m alone $(ALONE) $(PYTEST_ARGS)

bench: $(STAMP) $(HOROVOD)
	$(BIN)/python benchmarks/harness_overhead.py

# Every GPU path on this node through the real launcher, one line each: PASS, FAIL <reason>,
# NOT INSTALLED <what> or SKIP no CUDA device; exit 1 when any fails (docs/gpu-validation.md).
gpu-check: $(STAMP)
	PYTHONPATH=workflow $(BIN)/python -m trainscale gpu-check $(GPU_CHECK_ARGS)

# `snakemake --profile slurm` finds profiles in ~/.config/snakemake (not in profiles/): install
# ours there once, then set slurm_account/slurm_partition in it. An edited copy is never replaced.
SLURM_PROFILE_DIR ?= $(or $(XDG_CONFIG_HOME),$(HOME)/.config)/snakemake/slurm
slurm-profile:
	@mkdir -p "$(SLURM_PROFILE_DIR)"
	@if [ -e "$(SLURM_PROFILE_DIR)/config.yaml" ] && ! cmp -s profiles/slurm/config.yaml "$(SLURM_PROFILE_DIR)/config.yaml"; then \
	  echo "kept your $(SLURM_PROFILE_DIR)/config.yaml (differs from profiles/slurm/config.yaml)"; \
	else cp profiles/slurm/config.yaml "$(SLURM_PROFILE_DIR)/config.yaml"; \
	  echo "installed $(SLURM_PROFILE_DIR)/config.yaml: set slurm_account/slurm_partition in it, then: snakemake --profile slurm"; fi

# A throw-away 2-node SLURM on this machine (root; Debian packages installed if missing).
slurm-start:
	scripts/local-slurm.sh start
slurm-stop:
	scripts/local-slurm.sh stop

clean:
	rm -rf results logs .snakemake
