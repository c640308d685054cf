# The two commands a newcomer needs:   make emulate   and   make test
VENV := .venv
BIN := $(VENV)/bin
TYPECHECK := build/typecheck

.PHONY: setup emulate docker-emulation test lint typecheck pytest bench clean

setup:
	@bash scripts/setup.sh

emulate: setup
	$(BIN)/agiledart emulate

# the README's docker walk-through, unattended and checked (scripts/docker_emulation.py)
docker-emulation: setup
	$(BIN)/python scripts/docker_emulation.py

test: setup lint typecheck pytest

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy does not follow setuptools' package-dir mapping in an editable install, so the
# strict type check runs over a plain install of the package.
typecheck:
	@rm -rf $(TYPECHECK) build/lib  # a stale build/lib would bring back moved modules
	@$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps . --target $(TYPECHECK) 2>/dev/null
	MYPYPATH=$(TYPECHECK) $(BIN)/mypy -p agiledart

pytest:
	$(BIN)/pytest

bench: setup
	$(BIN)/python scripts/bench_overlay.py --peers 1000 --json

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
