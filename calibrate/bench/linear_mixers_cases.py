"""The cases of :mod:`calibrate.bench.linear_mixers`: every kernel, shape family and tier it
times, as rows with their analytical FLOPs and bytes (``--plan`` lists them without a GPU).
Standard library only."""

from __future__ import annotations

COLUMNS = (
    "case", "kernel", "package", "version", "impl", "direction", "mode", "family", "tier",
    "batch", "seq_len", "heads", "key_heads", "dk", "dv", "d_state", "ngroups", "chunk",
    "conv_dim", "conv_width", "state_dtype", "time_ms", "reps", "first_call_s", "flops",
    "bytes", "tflops", "tb_s", "status", "error", "note",
)  # fmt: skip
KERNEL_COLUMNS = ("case", "kernel_name", "calls", "device_us")

# the first shape of a family is the one Triton autotunes on (its keys hold no length)
TOKENS = ((1, 8192), (1, 2048), (1, 4096), (1, 32768), (4, 4096), (8, 2048))
DECODE_BATCHES = (32, 1, 8, 128, 256)
GDN_CHUNK = 64  # fla's chunk size for GDN and KDA
# (family, heads (value), key heads passed to the kernel, dk, dv, tier)
GDN_FAMILIES = (
    ("qwen3-next-hf", 32, 32, 128, 128, 1),  # HF repeats q/k 16 -> 32 heads
    ("qwen3-next-gva", 32, 16, 128, 128, 2),  # kernel's GVA path (vLLM layout)
    ("h16", 16, 16, 128, 128, 2),
    ("h64", 64, 64, 128, 128, 2),
    ("h32-d64", 32, 32, 64, 64, 2),
    ("h32-dv256", 32, 32, 128, 256, 2),
)
KDA_FAMILIES = (("kimi-linear", 32, 32, 128, 128, 1),)
# (family, nheads, headdim, d_state, ngroups, chunk, tier)
SSD_FAMILIES = (
    ("nemotron-h-8b", 128, 64, 128, 8, 128, 1),
    ("granite-4.0-h", 128, 64, 128, 1, 256, 2),
    ("nemotron-nano-9b-v2", 128, 80, 128, 8, 128, 2),
    ("falcon-h1-like", 128, 64, 256, 1, 256, 2),
    ("small-h48", 48, 64, 128, 8, 128, 2),
    ("falcon-h1-h24", 24, 64, 256, 1, 256, 3),
)
MAMBA1_FAMILIES = (("jamba-mini", 8192, 16, 1), ("jamba-large", 16384, 16, 2))
# (family, conv channels, tier): Qwen3-Next q,k,v = 2*2048 + 4096; Nemotron-H x,B,C
CONV_FAMILIES = (("gdn-qwen3-next", 8192, 1), ("mamba2-nemotron-h", 10240, 2))
CONV_WIDTH = 4
# representative cases (case ids) that get a profiler trace
TRACE_CASES = {
    "gdn:fwd:eager:qwen3-next-hf:1x8192", "gdn:fwdbwd:eager:qwen3-next-hf:1x8192",
    "gdn:decode:graph:qwen3-next-hf:128", "kda:fwd:eager:kimi-linear:1x8192",
    "kda:fwdbwd:eager:kimi-linear:1x8192", "kda:decode:graph:kimi-linear:128",
    "ssd:fwd:eager:nemotron-h-8b:1x8192", "ssd:fwdbwd:eager:nemotron-h-8b:1x8192",
    "ssd:decode:graph:nemotron-h-8b:bf16:128", "mamba1:decode:graph:jamba-mini:128",
    "conv1d:fwd:eager:torch:gdn-qwen3-next:1x8192",
    "conv1d:fwd:eager:fla-triton:gdn-qwen3-next:1x8192",
}  # fmt: skip
# seconds a case may need when its kernels are not compiled yet (else REST_NEED_S)
FIRST_NEED_S = {"fwd": 45.0, "fwdbwd": 90.0, "decode": 15.0}
REST_NEED_S = 4.0
BROKEN_EXIT = 42  # exit status after a sticky CUDA error (the device script restarts)
INJECT_BROKEN_ENV = "LINEAR_MIXERS_INJECT_BROKEN"  # a case id: act as if it broke CUDA
CHECKS_NEED_S = 25.0

DEV = "cuda"
VERSIONS: dict[str, str] = {}


# ------------------------------------------------------------------------------ the plan


def _row(**kw) -> dict:
    return {c: kw.get(c, "") for c in COLUMNS}


def plan() -> list[dict]:
    """Every case, tier by tier: tier 1 gives each kernel its main shapes, tier 2 the
    shape families, tier 3 CUDA-graph prefill and extras."""
    cases: list[dict] = []
    for tier in (1, 2, 3):
        for fam, h, hk, dk, dv, t in GDN_FAMILIES:
            if t == tier:
                for d in ("fwd", "fwdbwd"):
                    for b, s in TOKENS:
                        cases.append(_chunk_case("gdn", fam, t, d, "eager", b, s, h, hk, dk, dv))
        for fam, h, hk, dk, dv, t in KDA_FAMILIES:
            if t == tier:
                for d in ("fwd", "fwdbwd"):
                    for b, s in TOKENS:
                        cases.append(_chunk_case("kda", fam, t, d, "eager", b, s, h, hk, dk, dv))
        for fam, h, p, n, g, c, t in SSD_FAMILIES:
            if t == tier:
                dirs = ("fwd", "fwdbwd") if t < 3 else ("fwd",)
                for d in dirs:
                    for b, s in TOKENS:
                        cases.append(_ssd_case(fam, t, d, "eager", b, s, h, p, n, g, c))
        for fam, ch, t in CONV_FAMILIES:
            for d in ("fwd", "fwdbwd"):
                ct = max(t, 2 if d == "fwdbwd" else 1)
                if ct != tier:
                    continue
                for impl in ("torch", "fla-triton"):
                    for b, s in TOKENS:
                        cases.append(_conv_case(fam, ct, d, impl, b, s, ch))
        # decode: eager, then graph (the graph rows come after every eager row of the tier)
        for mode in ("eager", "graph"):
            for fam, h, hk, dk, dv, t in GDN_FAMILIES:
                if t == tier:
                    for b in DECODE_BATCHES:
                        cases.append(_decode_case("gdn", fam, t, mode, b, h, hk, dk, dv))
            for fam, h, hk, dk, dv, t in KDA_FAMILIES:
                if t == tier:
                    for b in DECODE_BATCHES:
                        cases.append(_decode_case("kda", fam, t, mode, b, h, hk, dk, dv))
            for fam, h, p, n, g, c, t in SSD_FAMILIES:
                if t == tier:
                    for b in DECODE_BATCHES:
                        cases.append(_ssd_decode_case(fam, t, mode, b, h, p, n, g, c, "bf16"))
                if tier == 2 and fam == "nemotron-h-8b":
                    for b in DECODE_BATCHES:
                        cases.append(_ssd_decode_case(fam, 2, mode, b, h, p, n, g, c, "fp32"))
            for fam, d_inner, n, t in MAMBA1_FAMILIES:
                if t == tier:
                    for b in DECODE_BATCHES:
                        cases.append(_mamba1_case(fam, t, mode, b, d_inner, n))
        if tier == 3:  # prefill forward replayed as a CUDA graph (launch gaps removed)
            for fam, h, hk, dk, dv, _t in GDN_FAMILIES[:1]:
                for b, s in TOKENS:
                    cases.append(_chunk_case("gdn", fam, 3, "fwd", "graph", b, s, h, hk, dk, dv))
            for fam, h, hk, dk, dv, _t in KDA_FAMILIES:
                for b, s in TOKENS:
                    cases.append(_chunk_case("kda", fam, 3, "fwd", "graph", b, s, h, hk, dk, dv))
            for fam, h, p, n, g, c, _t in SSD_FAMILIES[:1]:
                for b, s in TOKENS:
                    cases.append(_ssd_case(fam, 3, "fwd", "graph", b, s, h, p, n, g, c))
    return cases


def _chunk_case(kernel, fam, tier, d, mode, b, s, h, hk, dk, dv) -> dict:
    c = GDN_CHUNK
    flops = b * s * h * (2 * c * (dk + dv) + 6 * dk * dv)
    gate = b * s * h * (4 if kernel == "gdn" else 2 * dk)  # GDN fp32 g; KDA bf16 raw gate
    inp = 2 * b * s * hk * dk * 2 + b * s * h * dv * 2 + gate + b * s * h * 2
    out = b * s * h * dv * 2
    if d == "fwd":
        nbytes = inp + out + b * h * dk * dv * 4  # the final state (fp32)
    else:
        flops *= 3
        nbytes = 3 * inp + 2 * out
    impl = "chunk_gated_delta_rule" if kernel == "gdn" else "chunk_kda"
    return _row(
        case=f"{kernel}:{d}:{mode}:{fam}:{b}x{s}", kernel=kernel, package="fla", impl=impl,
        direction=d, mode=mode, family=fam, tier=tier, batch=b, seq_len=s, heads=h,
        key_heads=hk, dk=dk, dv=dv, chunk=c, state_dtype="fp32", flops=flops, bytes=nbytes,
    )  # fmt: skip


def _decode_case(kernel, fam, tier, mode, b, h, hk, dk, dv) -> dict:
    flops = 6 * b * h * dk * dv
    gate = b * h * (4 if kernel == "gdn" else 2 * dk)
    nbytes = 2 * b * h * dk * dv * 4 + 2 * b * hk * dk * 2 + 2 * b * h * dv * 2 + gate
    impl = "fused_recurrent_gated_delta_rule" if kernel == "gdn" else "fused_recurrent_kda"
    return _row(
        case=f"{kernel}:decode:{mode}:{fam}:{b}", kernel=kernel, package="fla", impl=impl,
        direction="decode", mode=mode, family=fam, tier=tier, batch=b, seq_len=1, heads=h,
        key_heads=hk, dk=dk, dv=dv, state_dtype="fp32", flops=flops, bytes=nbytes,
    )  # fmt: skip


def _ssd_case(fam, tier, d, mode, b, s, h, p, n, g, c) -> dict:
    flops = b * s * (g * 2 * c * n + h * (2 * c * p + 4 * n * p))
    inp = b * s * h * p * 2 + b * s * h * 2 + 2 * b * s * g * n * 2
    out = b * s * h * p * 2
    if d == "fwd":
        nbytes = inp + out + b * h * p * n * 4
    else:
        flops *= 3
        nbytes = 3 * inp + 2 * out
    return _row(
        case=f"ssd:{d}:{mode}:{fam}:{b}x{s}", kernel="ssd", package="mamba_ssm",
        impl="mamba_chunk_scan_combined", direction=d, mode=mode, family=fam, tier=tier,
        batch=b, seq_len=s, heads=h, key_heads=g, dk=n, dv=p, d_state=n, ngroups=g, chunk=c,
        state_dtype="fp32", flops=flops, bytes=nbytes,
    )  # fmt: skip


def _ssd_decode_case(fam, tier, mode, b, h, p, n, g, c, sdt) -> dict:
    sb = 2 if sdt == "bf16" else 4
    nbytes = 2 * b * h * p * n * sb + 2 * b * h * p * 2 + b * h * 2 + 2 * b * g * n * 2
    return _row(
        case=f"ssd:decode:{mode}:{fam}:{sdt}:{b}", kernel="ssd", package="mamba_ssm",
        impl="selective_state_update", direction="decode", mode=mode, family=fam, tier=tier,
        batch=b, seq_len=1, heads=h, key_heads=g, dk=n, dv=p, d_state=n, ngroups=g, chunk=c,
        state_dtype=sdt, flops=5 * b * h * p * n, bytes=nbytes,
    )  # fmt: skip


def _mamba1_case(fam, tier, mode, b, d_inner, n) -> dict:
    nbytes = 2 * b * d_inner * n * 2 + 4 * b * d_inner * 2 + 2 * b * n * 2
    return _row(
        case=f"mamba1:decode:{mode}:{fam}:{b}", kernel="mamba1", package="mamba_ssm",
        impl="selective_state_update", direction="decode", mode=mode, family=fam, tier=tier,
        batch=b, seq_len=1, heads=1, key_heads=1, dk=n, dv=d_inner, d_state=n,
        state_dtype="bf16", flops=5 * b * d_inner * n, bytes=nbytes,
    )  # fmt: skip


def _conv_case(fam, tier, d, impl, b, s, ch) -> dict:
    flops = 2 * CONV_WIDTH * b * s * ch
    io = b * s * ch * 2
    nbytes = 2 * io if d == "fwd" else 5 * io
    if d == "fwdbwd":
        flops *= 3
    pkg = "torch" if impl == "torch" else "fla"
    return _row(
        case=f"conv1d:{d}:eager:{impl}:{fam}:{b}x{s}", kernel="conv1d", package=pkg,
        impl=impl, direction=d, mode="eager", family=fam, tier=tier, batch=b, seq_len=s,
        conv_dim=ch, conv_width=CONV_WIDTH, flops=flops, bytes=nbytes,
    )  # fmt: skip


def compile_key(c: dict) -> tuple:
    """Cases that share compiled (autotuned) kernels: later ones need only seconds."""
    return (c["kernel"], c["impl"], c["direction"], c["heads"], c["key_heads"], c["dk"],
            c["dv"], c["ngroups"], c["chunk"], c["conv_dim"], c["state_dtype"])  # fmt: skip
