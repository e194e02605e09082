"""The device check in one run (called by device_check.sh): environment, copy bandwidth, every
kernel against an independent float64 reference written from its equations (``equations``, not
the contracts the kernels implement) at test and realistic sizes, timings against the bytes
floor and the torch contracts, the targets, and the CUDA test files (lossless on --device cuda).
Writes ``device_report.json`` and ``device_report.md`` into --out and prints the table last.

    python kernels_cuda/scripts/device_check.py --out DIR [--sizes h200|tiny] [--device cuda|cpu]

Every target reads PASS, FAIL or NOT RUN (a check skipped is never a pass). ``--device cpu`` is
a DRY RUN, labelled so in both reports: the torch contracts stand in for the kernels (so the
correctness rows check the contracts against the equations), and the GPU timing targets are
NOT RUN. Exit code 1 when a target fails, else 0.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from tsspec_kernels_cuda import check, reference
from tsspec_kernels_cuda.loader import LOADER, probe

OPS = ("gdn_verify", "gdn_step", "gdn_commit", "dflash_inject", "dflash_block_attention", "dflash_grouped_conv",
       "selector_lattice")
F32_TOL = 1e-5
PASS, FAIL = "PASS", "FAIL"
NOT_RUN = "NOT RUN"
TESTS = ["kernels_cuda/tests"]  # the CUDA tests (lossless on --device cuda) and the CPU ones


def environment(device: str) -> dict:
    env = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "python": platform.python_version(),
           "torch": torch.__version__, "device": device}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, sms=props.multi_processor_count, memory_gib=round(props.total_memory / 2**30, 1),
                   torch_cuda=torch.version.cuda)
        try:
            import cupy

            env["cupy"] = cupy.__version__
        except Exception as exc:  # noqa: BLE001
            env["cupy"] = f"not importable: {exc}"
        env["probe"] = probe().describe()
    return env


def implementations(device: str) -> dict:
    if device == "cpu":
        return {op: getattr(reference, op) for op in OPS}
    from tsspec_kernels_cuda import ops

    return {op: getattr(ops, op) for op in OPS}


def correctness(impl, device) -> dict:
    results = {}
    odd = check.Sizes(nk=3, nv=6, dk=24, dv=72, verify_rows=9, gdn_layers=2, hidden=96, taps=3, d_layers=3, heads=6,
                      kv_heads=3, head_dim=32, block=7, ring_rows=64, context=50, inject_rows=9, conv_k=4,
                      conv_group=12, vocab=1000, rank=24, top_k=6)
    for name, sizes in (("tiny", check.TINY), ("odd", odd), ("full", SIZES)):
        for seed in (0, 1):
            errors = {**check.check_gdn(impl, sizes, device, seed), **check.check_dflash(impl, sizes, device, seed),
                      **check.check_lattice(impl, sizes, device, seed)}
            for key, value in errors.items():
                results[f"{name}.{key}"] = max(value, results.get(f"{name}.{key}", 0.0))
    return results


def timings(impl, device, bandwidth) -> dict:
    """Median ms of each op (kernel and torch contract), its bytes floor and the ratios."""
    s = SIZES
    rows = s.verify_rows
    out = {}
    # gdn_verify: rotate over gdn_layers layers' states so the L2 never holds the inputs
    cases = [check.gdn_case(s, device, seed) for seed in range(s.gdn_layers)]
    slots = torch.empty((rows, s.nv, s.dk, s.dv), device=device)
    conv_dim = cases[0]["mixed"].shape[1]
    window = torch.empty((s.conv_kernel - 1 + rows, conv_dim), device=device)

    def verify_all(ops):
        for c in cases:
            ops["gdn_verify"](c["mixed"], c["conv_in"], c["conv_w"], c["beta"], c["alpha"], c["a_neg"], c["dt_bias"],
                              c["key_index"], c["state"], slots, window, num_k=s.nk, dk=s.dk, scale=s.dk**-0.5)

    per_layer = lambda ms: ms / len(cases)  # noqa: E731
    out["gdn_verify"] = dict(kernel_ms=per_layer(check.median_ms(lambda: verify_all(impl), device, reps=10)),
                             torch_ms=per_layer(check.median_ms(lambda: verify_all(check_ref), device, reps=3, warmup=1)),
                             floor_ms=check.gdn_bytes(s, rows) / bandwidth, unit="per layer, k+1 = %d rows" % rows)
    # gdn_commit: every layer's slot m into its live state in one launch (the rollback)
    layer_slots = [torch.randn((rows, s.nv, s.dk, s.dv), device=device) for _ in cases]
    windows = [torch.randn((s.conv_kernel - 1 + rows, conv_dim), device=device) for _ in cases]
    states = [c["state"] for c in cases]
    convs = [c["conv_in"] for c in cases]
    commit_bytes = len(cases) * (2 * s.nv * s.dk * s.dv * 4 + 2 * (s.conv_kernel - 1) * conv_dim * 4)
    out["gdn_commit"] = dict(kernel_ms=check.median_ms(lambda: impl["gdn_commit"](layer_slots, windows, states, convs, 3), device),
                             torch_ms=check.median_ms(lambda: reference.gdn_commit(layer_slots, windows, states, convs, 3), device),
                             floor_ms=commit_bytes / bandwidth, unit=f"all {len(cases)} layers")
    # dflash_inject: the committed rows of every drafter layer, one launch
    c = check.dflash_case(s, device, 0)
    rings = check._rings(s, device)
    inject = lambda ops: ops["dflash_inject"](c["features"], c["fc"], c["enc_norm"], c["layers"], rings,  # noqa: E731
                                              c["positions"], eps=1e-6, rope_base=1e6)
    out["dflash_inject"] = dict(kernel_ms=check.median_ms(lambda: inject(impl), device),
                                torch_ms=check.median_ms(lambda: inject(check_ref), device),
                                floor_ms=check.inject_bytes(s) / bandwidth, unit=f"{s.inject_rows} rows, {s.d_layers} layers")
    g = torch.Generator().manual_seed(3)
    B, R = s.block, s.ring_rows
    q = torch.randn(B, s.heads, s.head_dim, generator=g).to(device)
    kv = [torch.randn(R, s.kv_heads, s.head_dim, generator=g).to(device) for _ in range(2)]
    pos = torch.arange(s.context - R, s.context, device=device)
    blk = [torch.randn(B, s.kv_heads, s.head_dim, generator=g).to(device) for _ in range(2)]
    att = lambda ops: ops["dflash_block_attention"](q, kv[0], kv[1], pos, blk[0], blk[1], start=s.context,  # noqa: E731
                                                    window=R - B - 8, scale=s.head_dim**-0.5)
    att_bytes = 4 * (2 * R * s.kv_heads * s.head_dim + R + 2 * B * s.heads * s.head_dim)
    out["dflash_block_attention"] = dict(kernel_ms=check.median_ms(lambda: att(impl), device),
                                         torch_ms=check.median_ms(lambda: att(check_ref), device),
                                         floor_ms=att_bytes / bandwidth, unit=f"one layer, ring {R}")
    x = torch.randn(B, s.hidden, generator=g).to(device)
    base = torch.randn(s.conv_k, s.hidden, generator=g).to(device)
    coef = torch.randn(B, 2, s.conv_k, s.hidden // s.conv_group, generator=g).to(device)[:, 1]
    conv = lambda ops: ops["dflash_grouped_conv"](x, coef, base, s.conv_group, x)  # noqa: E731
    out["dflash_grouped_conv"] = dict(kernel_ms=check.median_ms(lambda: conv(impl), device),
                                      torch_ms=check.median_ms(lambda: conv(check_ref), device),
                                      floor_ms=4 * (3 * B * s.hidden + s.conv_k * s.hidden) / bandwidth, unit="one side")
    lc = check.lattice_case(s, device, 0)
    lat = lambda ops: ops["selector_lattice"](lc["logits"], lc["hidden"], lc["P"], lc["A"], lc["B"], 11, s.top_k)  # noqa: E731
    lat_bytes = 4 * lc["logits"].numel() + 4 * lc["P"].numel()
    out["selector_lattice"] = dict(kernel_ms=check.median_ms(lambda: lat(impl), device),
                                   torch_ms=check.median_ms(lambda: lat(check_ref), device),
                                   floor_ms=lat_bytes / bandwidth, unit=f"{B - 1} rows x vocab {s.vocab}")
    for row in out.values():
        row["x_floor"] = row["kernel_ms"] / row["floor_ms"] if row["floor_ms"] else None
        row["x_torch"] = row["torch_ms"] / row["kernel_ms"] if row["kernel_ms"] else None
    return out


check_ref = {op: getattr(reference, op) for op in OPS}


def dflash_block_vs_decode(impl, device, bandwidth) -> dict:
    """inject + one draft block of the DFlash head at SIZES, against the target decode step's
    floor (its weight bytes over the measured bandwidth; a real step is slower)."""
    from tsspec_block.config import DFlashConfig
    from tsspec_block.head import DFlashDraftHead
    from tsspec_block.weights import DFlashWeights, LayerWeights

    s = SIZES
    g = torch.Generator(device=device).manual_seed(0)
    H, F_, nh, nkv, hd = s.hidden, 3 * s.hidden, s.heads, s.kv_heads, s.head_dim

    def r(*shape, scale=None):
        return torch.randn(*shape, generator=g, device=device) * (scale or shape[-1] ** -0.5)

    cfg = DFlashConfig(num_layers=s.d_layers, hidden_size=H, ffn_size=F_, n_head=nh, n_head_kv=nkv, head_dim=hd,
                       value_dim=hd, rope_base=1e6, eps=1e-6, block_size=s.block, target_layers=tuple(range(s.taps)),
                       target_hidden_size=H, mask_token_id=1, sliding_window=s.context, sliding_layers=())
    layers = tuple(LayerWeights(attn_norm=1 + r(H, scale=0.1), wq=r(nh * hd, H), wk=r(nkv * hd, H), wv=r(nkv * hd, H),
                                wo=r(H, nh * hd), q_norm=1 + r(hd, scale=0.1), k_norm=1 + r(hd, scale=0.1),
                                ffn_norm=1 + r(H, scale=0.1), w_gate=r(F_, H), w_up=r(F_, H), w_down=r(H, F_))
                   for _ in range(s.d_layers))
    weights = DFlashWeights(fc=r(H, s.taps * H), enc_norm=1 + r(H, scale=0.1), out_norm=1 + r(H, scale=0.1), layers=layers)

    class Target:  # the borrowed embedding and LM head of a 150k-vocabulary target, bf16
        def __init__(self):
            self.device = torch.device(device)
            self.table = r(s.vocab, H, scale=0.02).to(torch.bfloat16)

        def embed(self, ids):
            return self.table[torch.as_tensor(ids, device=device)]

        def lm_head(self, h):
            return h.to(torch.bfloat16) @ self.table.T

    results = {}
    feats = torch.randn(s.context + 64, s.taps * H, generator=g, device=device)
    for name, kernels in (("kernels", impl), ("torch", {})):
        # the torch side is the reference: no registered kernels and no native CPU pass
        head = DFlashDraftHead(cfg, weights, Target(), kernels=kernels, **({} if kernels else {"native": False}))
        head.draft_catch_up(list(range(s.context)), feats[: s.context], 1)
        pos = [s.context]

        def block():
            p = pos[0]
            head.draft_catch_up(list(range(s.inject_rows)), feats[p - s.inject_rows : p], p - s.inject_rows + 1)
            head.draft_block(5, None, p, s.block - 1)

        results[f"{name}_ms"] = check.median_ms(block, device, reps=10, warmup=3)
        results[f"{name}_in_use"] = head.kernels_in_use
    results["target_step_floor_ms"] = s.target_bytes / bandwidth
    results["ratio"] = results["kernels_ms"] / results["target_step_floor_ms"]
    results["drafter_weight_bytes"] = check.block_bytes(s) + 4 * H * s.taps * H
    return results


def rollback(impl, device) -> dict:
    """spec_keep after a partially accepted 8-row verify on a qwen35 trunk whose GDN layers have
    SIZES' heads (16 key / 32 value heads of 128 at h200 sizes): the slot path with the kernels,
    the slot path on torch, and the restore + re-forward path. Median ms of the keep and the
    forwards it ran."""
    from tsspec_model_qwen35.loader import load_from_source
    from tsspec_model_qwen35.source import MemorySource
    from tsspec_model_qwen35.synthetic import SyntheticSpec, random_model

    s = SIZES
    spec = SyntheticSpec(vocab_size=4096 if s.hidden >= 1024 else 64, hidden_size=min(s.hidden, 1024), num_layers=4,
                         full_attention_interval=4, num_heads=8, num_kv_heads=2, head_dim=128 if s.hidden >= 1024 else 8,
                         rope_dims=64 if s.hidden >= 1024 else 4, num_k_heads=s.nk, num_v_heads=s.nv, head_k_dim=s.dk,
                         head_v_dim=s.dv, ffn_size=2 * min(s.hidden, 1024))
    arch, meta, tensors = random_model(spec, seed=0)
    results = {}
    for name, kernels, per_row in (("kernels", impl, True), ("torch_slots", None, True), ("torch_reforward", None, False)):
        target = load_from_source(MemorySource(arch, meta, tensors), dtype="float32", device=device, kernels=kernels,
                                  per_row_snapshots=per_row)
        target.spec_forward([1 + i % 60 for i in range(64)], all_logits_rows=False, want_hidden=False)
        target.spec_keep(64)
        times, reforwards = [], 0
        for step in range(12):
            target.spec_forward([7 + step] * 8, all_logits_rows=True, want_hidden=False)
            before = target.counters.forward_calls
            if torch.device(device).type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            target.spec_keep(3)
            if torch.device(device).type == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
            reforwards += target.counters.forward_calls - before
        results[name] = {"keep_ms": sorted(times[2:])[len(times[2:]) // 2], "reforwards": reforwards,
                         "in_use": target.kernels_in_use}
    return results


def run_tests(out_dir: Path) -> dict:
    started = time.perf_counter()
    log = out_dir / "pytest.log"
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:randomly", *TESTS]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log.write_text(proc.stdout + proc.stderr)
    tail = [line for line in proc.stdout.splitlines() if line.strip()][-1:] or ["(no output)"]
    return {"command": " ".join(cmd[1:]), "exit_code": proc.returncode, "summary": tail[0],
            "seconds": round(time.perf_counter() - started, 1)}


def verdicts(report) -> dict:
    """Target -> PASS / FAIL / NOT RUN (with why): a skipped check never reads PASS."""
    t, block = report["timings"], report["dflash_block"]
    dry = report["dry_run"]
    worst = max(report["correctness"].values())
    subject = "torch contract (dry run: no kernel)" if dry else "kernel"
    verdict = lambda ok: PASS if ok else FAIL  # noqa: E731
    gpu_timing = f"{NOT_RUN}: dry run on the CPU (a contract's CPU time is no kernel timing)"
    tests = report["tests"]
    return {
        f"every {subject} within 1e-5 of the float64 equations": verdict(worst <= F32_TOL),
        "fused GDN verify within 2x its bytes floor": gpu_timing if dry else verdict(t["gdn_verify"]["x_floor"] <= 2.0),
        "rollback: no re-forward (spec_keep commits a slot on the device)": verdict(
            report["rollback"]["kernels"]["reforwards"] == 0 and "gdn_commit" in report["rollback"]["kernels"]["in_use"]),
        "DFlash block (inject + draft) under 20% of a target decode step": gpu_timing if dry else verdict(block["ratio"] < 0.2),
        "lossless tests pass on the device": (f"{NOT_RUN}: {tests['summary']}" if tests["exit_code"] is None
                                               else f"{NOT_RUN}: dry run on the CPU" if dry else verdict(tests["exit_code"] == 0)),
    }


def markdown(report) -> str:
    env = report["environment"]
    title = "DRY RUN on the CPU (torch contracts standing in for the kernels), " if report["dry_run"] else ""
    lines = [f"# kernels_cuda device check: {title}{env['date']}", "",
             f"Machine: {env.get('gpu', env['device'])}, torch {env['torch']}, CuPy {env.get('cupy', '-')}; "
             f"copy bandwidth {report['bandwidth_gbs']:.0f} GB/s (read + write).", "", "## Targets", ""]
    lines += [f"- {status}: {name}" for name, status in report["verdicts"].items()]
    lines += ["", "## Correctness (max relative error against the float64 equations, worst of two seeds)", "",
              "| check | error |", "| --- | --- |"]
    lines += [f"| {k} | {v:.2e} |" for k, v in sorted(report["correctness"].items())]
    lines += ["", "## Timings (median ms)", "", "| op | size | kernel | torch | floor | x floor | torch / kernel |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for op, row in report["timings"].items():
        lines.append(f"| {op} | {row['unit']} | {row['kernel_ms']:.4f} | {row['torch_ms']:.4f} | {row['floor_ms']:.4f} "
                     f"| {row['x_floor']:.2f} | {row['x_torch']:.2f} |")
    lines += ["", f"## Rollback (spec_keep of 3 of 8 verify rows, 3 GDN layers of {SIZES.nk}/{SIZES.nv} heads x {SIZES.dk})", "",
              "| path | keep ms (median) | re-forwards |", "| --- | --- | --- |"]
    lines += [f"| {name} | {row['keep_ms']:.3f} | {row['reforwards']} |" for name, row in report["rollback"].items()]
    b = report["dflash_block"]
    lines += ["", f"DFlash block (inject {SIZES.inject_rows} rows + draft {SIZES.block}): {b['kernels_ms']:.3f} ms with "
              f"kernels, {b['torch_ms']:.3f} ms torch; target step floor {b['target_step_floor_ms']:.3f} ms "
              f"({SIZES.target_bytes / 1e9:.0f} GB of weights): ratio {b['ratio']:.3f}.", "",
              f"Tests: `{report['tests']['command']}` -> {report['tests']['summary']} (exit {report['tests']['exit_code']}).",
              "", f"Compiled: {', '.join(report['compiled']) or '-'}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    global SIZES
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", choices=("h200", "tiny"), default="h200")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--skip-tests", action="store_true")
    args = parser.parse_args(argv)
    SIZES = check.Sizes() if args.sizes == "h200" else check.TINY
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = args.device
    if device == "cuda" and not (torch.cuda.is_available() and probe().available):
        print(f"no CUDA kernels here: torch.cuda={torch.cuda.is_available()}, {probe().describe()}")
        return 2
    impl = implementations(device)
    report = {"environment": environment(device), "dry_run": device == "cpu"}
    t0 = time.perf_counter()
    bandwidth = check.copy_bandwidth(device, 1 << 30 if device == "cuda" else 1 << 22)  # bytes per ms
    report["bandwidth_gbs"] = bandwidth / 1e6
    report["correctness"] = correctness(impl, device)
    report["timings"] = timings(impl, device, bandwidth)
    report["dflash_block"] = dflash_block_vs_decode(impl, device, bandwidth)
    report["rollback"] = rollback(impl, device)
    report["compiled"] = list(LOADER.compiled)
    report["measure_seconds"] = round(time.perf_counter() - t0, 1)
    report["tests"] = ({"command": "-", "exit_code": None, "summary": "not run (--skip-tests)", "seconds": 0}
                       if args.skip_tests else run_tests(out_dir))
    report["verdicts"] = verdicts(report)
    (out_dir / "device_report.json").write_text(json.dumps(report, indent=2, default=str))
    text = markdown(report)
    (out_dir / "device_report.md").write_text(text)
    print(text)
    return 1 if FAIL in report["verdicts"].values() else 0


SIZES = check.Sizes()

if __name__ == "__main__":
    raise SystemExit(main())
