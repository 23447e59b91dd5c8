# Machine-unlearning pipeline. `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Offline switches (STACK_NOTES): nothing phones home.
export DO_NOT_TRACK := true
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export MLFLOW_DISABLE_TELEMETRY := true
export DVC_NO_ANALYTICS := 1
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 90
export GIT_PYTHON_REFRESH := quiet
export NO_MKDOCS_2_WARNING := 1
# A project-local Prefect home: the temporary server's SQLite lives here, not in ~/.prefect.
export PREFECT_HOME := $(CURDIR)/.prefect
export PATH := $(CURDIR)/$(BIN):$(PATH)

PREFECT_PORT ?= 4200
MLFLOW_PORT ?= 5000
# Team deployment (deploy/team.py): a project-local PostgreSQL cluster and both servers, state under $(TEAM_DIR).
TEAM_DIR ?= $(CURDIR)/.team
TEAM_PG_PORT ?= 54329
TEAM_PY = deploy/team.py --dir $(TEAM_DIR)

.PHONY: help setup run report test test-slow test-all ui server serve bench docs docs-serve screenshots clean reset \
	team-db team-up team-env team-user team-status team-down device-pack

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-11s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,docs]'
	touch $(STAMP)

# The Prefect database's migrations run once here, not inside the first `make run` (its temporary server then
# starts in about 10 s instead of 15-20 s on these machines). Skipped for a server database of your own.
# The version stamp beside it tells `make run`'s temporary server that the database is at this Prefect's head,
# so it skips the migration check at start (2 s on these machines; flows/session.py, prefect_db_is_migrated).
PREFECT_DB := $(PREFECT_HOME)/prefect.db
$(PREFECT_DB): $(STAMP)
	@if [ -z "$$PREFECT_API_DATABASE_CONNECTION_URL" ]; then \
	  echo "preparing the Prefect database in $(PREFECT_HOME) (once)"; \
	  $(BIN)/prefect server database upgrade -y >/dev/null && \
	  $(BIN)/python -c "import importlib.metadata as m; print(m.version('prefect'))" > $@.version && touch $@; fi

# The MLflow store's tables, once (2.5 s inside the first run's train stage otherwise). Skipped for a tracking
# server of your own (MLFLOW_TRACKING_URI).
MLFLOW_DB := mlflow.db
$(MLFLOW_DB): $(STAMP)
	@if [ -z "$$MLFLOW_TRACKING_URI" ]; then \
	  echo "creating the MLflow store $(MLFLOW_DB) (once)"; \
	  out=$$($(BIN)/python -m flows.stores 2>&1) || { echo "$$out"; exit 1; }; fi

# The project's secret id key of hashed sample ids (unlearning/privacy/salt.py): made once, mode 0600 in a 0700 folder,
# git-ignored, never in the state, DVC or MLflow (back it up in your secret store); `make clean` keeps it, as it keeps
# the tombstones hashed with it. An older version's salt there is re-keyed once (tasks/rekey.py; docs/erasure.md).
SALT := .unlearning/salt
$(SALT): $(STAMP)
	@$(BIN)/python -m tasks.rekey

setup: $(STAMP) $(PREFECT_DB) $(MLFLOW_DB) $(SALT) ## create .venv, install the project (torch CPU 2.13.0 from local disk), create the stores and the id key
	@grep -qs '^hmac-sha256:' $(SALT) || [ ! -f $(SALT) ] || $(BIN)/python -m tasks.rekey

run: setup ## the main job: prepare digits, train, process every request file in the inbox (dvc repro deletion), erase
	@# One session: one temporary Prefect server and one warm worker (the imports done once) for every stage;
	@# `unlearn erase` does the part of the erasure a running `dvc repro` cannot (rewrite its outputs, dvc gc).
	$(BIN)/python -m flows.session $(BIN)/dvc repro deletion --then $(BIN)/unlearn erase --then $(BIN)/unlearn status

report: setup ## the evidence studies (dvc repro report/dvc.yaml): reports/*.json, MLflow, docs/evidence.md
	@# A DAG of its own (report/dvc.yaml), so a plain `dvc repro` never starts these tens of minutes of studies.
	$(BIN)/python -m flows.session --cold $(BIN)/dvc repro report/dvc.yaml   # the studies take minutes: no warm worker

# The fast tier on TEST_WORKERS processes (pytest-xdist), each test file whole on one of them (its module
# fixtures, a trained project, made once), in the files' order: tests/flow/ (few tests, minutes each) first, so
# that the many short unit tests even out the end (xdist's default hands out the files with most tests first);
# each worker with its own Prefect harness.
TEST_WORKERS ?= 2
test: setup ## fast unit + flow tests (the default tier): a progress line every 10 s, the 30 slowest at the end
	$(BIN)/python -m pytest -m "not slow and not gpu" -q --durations=30 -n $(TEST_WORKERS) --dist loadfile \
	  --no-loadscope-reorder; \
	  rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

test-slow: setup ## end-to-end tests: dvc repro, real servers, browser
	$(BIN)/python -m pytest -m "slow and not gpu" -q; rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

device-pack: setup ## pack .device/ (wheels, Fashion-MNIST) for the device check: bench/device/run.sh, docs/gpu.md
	PY=$(BIN)/python bash bench/device/pack.sh

test-all: setup ## every tier except gpu
	$(BIN)/python -m pytest -m "not gpu" -q; rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

ui: setup ## MLflow UI on 127.0.0.1:$(MLFLOW_PORT) over the project's store, opening on the batch runs
	@# `unlearn ui` (adapters/mlflow_ui.py): MLflow's server whose page opens an experiment on its batch runs
	@# (docs/review.md); a taken port is one line and exit 2. Any project of `unlearn init` runs the same command.
	$(BIN)/unlearn ui --port $(MLFLOW_PORT)

server: setup ## local Prefect server on 127.0.0.1:$(PREFECT_PORT) (SQLite; set PREFECT_API_DATABASE_CONNECTION_URL for Postgres)
	@# The UI's page asks its API at PREFECT_UI_API_URL, which Prefect derives from its settings (port 4200), not
	@# from --port: set from the port, so `make server PREFECT_PORT=4300` serves a UI that talks to port 4300.
	PREFECT_UI_API_URL=$${PREFECT_UI_API_URL:-http://127.0.0.1:$(PREFECT_PORT)/api} \
	  $(BIN)/prefect server start --host 127.0.0.1 --port $(PREFECT_PORT)

serve: setup ## serve the scheduled + event-triggered deployments and watch the inbox (needs `make server`)
	PREFECT_API_URL=$${PREFECT_API_URL:-http://127.0.0.1:$(PREFECT_PORT)/api} $(BIN)/unlearn serve

team-db: setup ## PostgreSQL for the team servers: a cluster in .team/pg on 127.0.0.1:$(TEAM_PG_PORT), databases prefect, mlflow, mlflow_auth
	$(BIN)/python $(TEAM_PY) --pg-port $(TEAM_PG_PORT) db

team-up: setup ## team-db + Prefect server (:$(PREFECT_PORT)) + MLflow server serving artifacts (:$(MLFLOW_PORT)), on Postgres, logins on both, in the background
	$(BIN)/python $(TEAM_PY) --pg-port $(TEAM_PG_PORT) --prefect-port $(PREFECT_PORT) --mlflow-port $(MLFLOW_PORT) up

team-env: ## the pipeline account's variables, secrets by reference to their files: eval "$(make -s team-env)"
	@$(PYTHON) $(TEAM_PY) env

team-user: ## an MLflow account on the team server: make team-user NAME=alice ROLE=reviewer|pipeline (password in .team/users/)
	@test -n "$(NAME)" -a -n "$(ROLE)" || { echo "error: give NAME=<account> ROLE=reviewer|pipeline"; exit 2; }
	$(BIN)/python $(TEAM_PY) user --name "$(NAME)" --role "$(ROLE)"

team-status: ## is the team setup up: PostgreSQL, both servers (health, pid, log)
	@$(PYTHON) $(TEAM_PY) status

team-down: ## stop both team servers and PostgreSQL (the data stays in .team/)
	$(PYTHON) $(TEAM_PY) down

bench: setup ## benchmarks: print ratios, write JSON under bench/results/
	$(BIN)/python bench/oracles.py
	$(BIN)/python bench/leverage.py
	$(BIN)/python bench/ensembles.py
	$(BIN)/python bench/calibration.py
	$(BIN)/python bench/newton_removal.py
	$(BIN)/python bench/recipe_check.py
	$(BIN)/python bench/session_overhead.py
	$(BIN)/python bench/diagnostics_cost.py
	$(BIN)/python bench/request_validation.py
	$(BIN)/python bench/dask_scaling.py
	$(BIN)/python bench/batch_cost.py --full-data-plan   # regenerates the README's table
	$(BIN)/python bench/sharding.py   # SISA: the table on docs/sharding.md, a summary in the README

docs: setup ## build the docs site into site/ (mkdocs build --strict: a broken link or a missing page fails)
	$(BIN)/python docs/gen_params.py
	$(BIN)/mkdocs build --strict --site-dir site

screenshots: setup ## refresh docs/img/ (docs/review.md's pictures): the browser test on one batch, about 5 min
	DOCS_SCREENSHOTS=docs/img $(BIN)/python -m pytest -m slow -q -x tests/e2e/test_operations.py \
	  -k "dropped_file_is_processed or mlflow_ui_shows_the_batch"

docs-serve: setup ## serve the docs site on 127.0.0.1:8000, rebuilt on every edit
	$(BIN)/python docs/gen_params.py
	$(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000

reset: setup ## start over: `unlearn reset` archives state/ and cache/ (ledger kept, asks first)
	$(BIN)/unlearn reset

clean: ## remove every generated file, the MLflow store, the archive and the venv (no undo)
	rm -rf state .state.* cache mlflow.db mlartifacts archive data/prepared models/original.pt .prefect $(VENV) dvc.lock \
	  report/dvc.lock site
