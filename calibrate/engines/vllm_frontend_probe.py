"""Measure vLLM V1's own API-server (frontend) CPU cost per request on this machine.

    python calibrate/engines/vllm_frontend_probe.py --out DIR [--tokenizer-dir DIR]
        [--what tokenizer,tokenize,server,concurrency,fit] [--reps 5]

Runs in a virtualenv with vLLM 0.11.0 installed (see calibrate/data/vllm-frontend-cpu/README.md);
it imports nothing of simcli. No GPU, no weights, no hub access.

Tokenizer: a byte-level BPE with Llama-3's shape (pre-tokenizer regex of Llama-3's
tokenizer.json, ByteLevel bytes-to-unicode, 128,000 learned tokens + 256 special tokens =
128,256, ``<|begin_of_text|>`` prepended) trained with HF ``tokenizers`` on this machine's
Python standard library sources (a stand-in corpus: Llama-3's merges are not public without
the hub), wrapped as a ``PreTrainedTokenizerFast`` next to a Llama ``config.json``.

What is real: vLLM's OpenAI-compatible FastAPI app (``api_server.build_app`` +
``init_app_state``: middleware, request parsing/validation with pydantic,
``OpenAIServingCompletion``: tokenisation through vLLM's tokenizer wrapper, sampling-param
construction, the streaming generator that detokenises and writes one SSE chunk per token).
What is fake: the engine client. ``FakeEngine.generate`` yields, for each output token,
the ``RequestOutput`` that V1's ``OutputProcessor`` would hand to the API server after
incremental detokenisation, which it does here with vLLM's own ``IncrementalDetokenizer``
(so detokenisation is priced in-process, as in ``AsyncLLM``, where the OutputProcessor runs
in the API-server process). The engine core (scheduler, model) costs nothing and takes no time.

Outputs (``--out``): ``server.csv`` (one streaming ``/v1/completions`` request at a time over
prompt families x output lengths: wall and CPU to the first chunk and to the end),
``concurrency.csv`` (bursts of concurrent requests, a diagnostic), ``tokenize.csv``
(``encode`` alone), ``meta.json`` (versions, CPU, load, the fits and their held-out error).
Needs transformers 4.x (vLLM 0.11's tokenizer cache reads ``all_special_tokens_extended``):
see the data's README for the ``PYTHONPATH`` side folder.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

# Llama-3's pre-tokenizer split pattern (meta-llama/Meta-Llama-3-8B tokenizer.json,
# pre_tokenizer.pretokenizers[0].pattern.Regex; the same as tiktoken's cl100k_base).
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LEARNED_VOCAB = 128_000  # Llama-3: 128,000 BPE tokens + 256 reserved/special = 128,256
N_SPECIAL = 256
CORPUS_MAX_BYTES = 60_000_000


def corpus_files() -> list[Path]:
    """Local text only: Python's standard library sources (site-packages excluded), then the
    virtualenv's installed packages' ``.py`` / ``.md`` / ``.txt`` / ``.rst`` files, sorted."""
    import sysconfig

    std = Path(sysconfig.get_paths()["stdlib"])
    site = Path(sysconfig.get_paths()["purelib"])
    files = sorted(p for p in std.rglob("*.py") if "site-packages" not in p.parts)
    files += sorted(p for p in site.rglob("*") if p.suffix in (".py", ".md", ".txt", ".rst"))
    out, total = [], 0
    for p in files:
        try:
            n = p.stat().st_size
        except OSError:
            continue
        if total + n > CORPUS_MAX_BYTES:
            break
        out.append(p)
        total += n
    return out


def build_tokenizer(out_dir: str) -> str:
    """Train the Llama-3-shaped byte-level BPE and save it as a HF tokenizer folder."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if (out / "tokenizer.json").exists():
        return str(out)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    special = ["<|begin_of_text|>", "<|end_of_text|>"] + [
        f"<|reserved_special_token_{i}|>" for i in range(N_SPECIAL - 2)
    ]
    trainer = trainers.BpeTrainer(
        vocab_size=LEARNED_VOCAB,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    files = corpus_files()

    def lines():
        for p in files:
            yield p.read_text(encoding="utf-8", errors="replace")

    tok.train_from_iterator(lines(), trainer=trainer)
    tok.add_special_tokens(special)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)],
    )
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|begin_of_text|>",
                "eos_token": "<|end_of_text|>",
                "model_max_length": 131072,
                "clean_up_tokenization_spaces": True,
            }
        )
    )
    (out / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "num_hidden_layers": 1,
                "vocab_size": tok.get_vocab_size(),
                "max_position_embeddings": 131072,
                "rope_theta": 500000.0,
                "torch_dtype": "bfloat16",
                "bos_token_id": bos,
                "eos_token_id": tok.token_to_id("<|end_of_text|>"),
            }
        )
    )
    (out / "corpus.json").write_text(
        json.dumps(
            {
                "files": len(files),
                "bytes": sum(p.stat().st_size for p in files),
                "first": str(files[0]),
                "last": str(files[-1]),
                "vocab_size": tok.get_vocab_size(),
            }
        )
    )
    return str(out)


# --- the fake engine core (everything else in the API-server process is vLLM's) --------------
class FakeCoreClient:
    """Stands in for ``AsyncMPClient``: what it does in the API-server process is kept (msgpack
    encode of each ``EngineCoreRequest``, msgpack decode of each ``EngineCoreOutputs``); the
    engine core itself is an instant one-token-per-step loop whose own CPU time (building and
    encoding the outputs, i.e. the engine process's share) is summed in ``core_cpu_s`` so it can
    be subtracted."""

    def __init__(self, token_stream: list[int]):
        import asyncio

        from vllm.v1.engine import EngineCoreOutputs
        from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

        self.encoder = MsgpackEncoder()
        self.out_encoder = MsgpackEncoder()  # engine-core side
        self.decoder = MsgpackDecoder(EngineCoreOutputs)  # API-server side
        self.active: dict[str, list] = {}  # request_id -> [emitted, max_tokens]
        self.wake = asyncio.Event()
        self.token_stream = token_stream
        self.core_cpu_s = 0.0
        self.engine_ranks_managed = [0]
        self.resources = type("Resources", (), {"engine_dead": False})()

    async def add_request_async(self, request) -> None:
        self.encoder.encode(request)  # AsyncMPClient._send_input: encoder.encode(request)
        self.active[request.request_id] = [0, request.sampling_params.max_tokens]
        self.wake.set()

    async def get_output_async(self):
        import asyncio

        from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason

        while not self.active:
            self.wake.clear()
            await self.wake.wait()
        await asyncio.sleep(0)  # one engine step: let the API server run between steps
        t0 = time.process_time()
        outs = []
        for rid, st in list(self.active.items()):
            tok = self.token_stream[st[0] % len(self.token_stream)]
            st[0] += 1
            done = st[0] >= st[1]
            outs.append(
                EngineCoreOutput(
                    request_id=rid,
                    new_token_ids=[tok],
                    finish_reason=FinishReason.LENGTH if done else None,
                )
            )
            if done:
                del self.active[rid]
        frames = self.out_encoder.encode(
            EngineCoreOutputs(outputs=outs, timestamp=time.monotonic())
        )
        self.core_cpu_s += time.process_time() - t0
        return self.decoder.decode(frames)  # AsyncMPClient.process_outputs_socket: decode

    async def abort_requests_async(self, request_ids) -> None:
        for r in request_ids:
            self.active.pop(r, None)

    async def get_supported_tasks_async(self):
        return ("generate",)

    def shutdown(self):
        pass


def make_engine(model_dir: str, token_stream: list[int], log_stats: bool = True):
    """A real ``AsyncLLM`` (its ``Processor``, ``OutputProcessor``, output-handler task, stat
    loggers) whose engine-core client is :class:`FakeCoreClient`. ``__init__`` is replayed
    attribute by attribute because it would start the engine-core process."""
    from vllm.config import (
        DeviceConfig,
        ModelConfig,
        ObservabilityConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.transformers_utils.tokenizer import init_tokenizer_from_configs
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.engine.processor import Processor
    from vllm.v1.metrics.loggers import StatLoggerManager

    mc = ModelConfig(
        model=model_dir, tokenizer=model_dir, dtype="bfloat16", max_model_len=16384, seed=0
    )
    vc = VllmConfig(
        model_config=mc,
        device_config=DeviceConfig(device="cpu"),
        observability_config=ObservabilityConfig(),
        scheduler_config=SchedulerConfig(max_model_len=16384, max_num_batched_tokens=16384),
    )
    eng = AsyncLLM.__new__(AsyncLLM)
    eng.model_config, eng.vllm_config = mc, vc
    eng.observability_config = vc.observability_config
    eng.log_requests, eng.log_stats = False, log_stats
    eng.tokenizer = init_tokenizer_from_configs(model_config=mc)
    eng.processor = Processor(
        vllm_config=vc, tokenizer=eng.tokenizer, mm_registry=MULTIMODAL_REGISTRY
    )
    eng.output_processor = OutputProcessor(eng.tokenizer, log_stats=log_stats)
    eng.engine_core = FakeCoreClient(token_stream)
    eng.logger_manager = None
    if log_stats:
        eng.logger_manager = StatLoggerManager(
            vllm_config=vc,
            engine_idxs=[0],
            custom_stat_loggers=None,
            enable_default_loggers=True,
            client_count=1,
        )
    eng.output_handler = None
    eng.profiler = None
    return eng, vc


# --- the OpenAI server, driven through its ASGI interface -----------------------------------
SERVER_COLUMNS = [
    "family",
    "rep",
    "prompt_tokens",
    "output_tokens",
    "chunks",
    "first_chunk_wall_s",
    "first_chunk_cpu_s",
    "total_wall_s",
    "total_cpu_s",
    "core_cpu_s",
    "net_cpu_s",
]
PROMPT_FAMILIES = [100, 250, 500, 1000, 2000, 4000, 8000]
OUTPUT_LENGTHS = [1, 16, 64, 256]


def build_server(model_dir: str, token_stream: list[int]):
    """vLLM's own ``build_app`` + ``init_app_state`` with ``vllm serve``'s default arguments."""
    import asyncio

    from vllm.entrypoints.openai.api_server import build_app, init_app_state
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.platforms import current_platform
    from vllm.utils import FlexibleArgumentParser

    # No platform is detected without a GPU (UnspecifiedPlatform, device_type ""): the argument
    # parser's default DeviceConfig("auto") would raise. Name the CPU, as make_engine does.
    if not current_platform.device_type:
        current_platform.device_type = "cpu"
    parser = make_arg_parser(FlexibleArgumentParser())
    args = parser.parse_args(["--model", model_dir, "--max-model-len", "16384"])
    validate_parsed_serve_args(args)
    eng, vc = make_engine(model_dir, token_stream, log_stats=not args.disable_log_stats)
    app = build_app(args)
    asyncio.get_event_loop().run_until_complete(init_app_state(eng, vc, app.state, args))
    return app, eng, args


async def asgi_post(app, path: str, body: bytes, on_chunk) -> int:
    """One HTTP POST straight into the ASGI app (no socket, no HTTP parser: uvicorn's share is
    not included); ``on_chunk`` is called at each response body message."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
        "headers": [
            (b"host", b"127.0.0.1:8000"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"accept", b"*/*"),
        ],
    }
    sent = False
    status = [0]

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        import asyncio

        await asyncio.Event().wait()  # no disconnect

    async def send(msg):
        if msg["type"] == "http.response.start":
            status[0] = msg["status"]
        elif msg["type"] == "http.response.body" and msg.get("body"):
            on_chunk(msg["body"])

    await app(scope, receive, send)
    return status[0]


PROSE_DIR = "/usr/share/common-licenses"


def prose_ids(tokenizer) -> list[int]:
    """English prose for prompts and output tokens: this machine's license texts, tokenised."""
    text = "\n\n".join(
        p.read_text(errors="replace")
        for p in sorted(Path(PROSE_DIR).iterdir())
        if p.is_file() and not p.is_symlink()
    )
    return tokenizer.encode(text, add_special_tokens=False)


def prompt_text(tokenizer, ids: list[int], n_tokens: int, offset: int) -> str:
    """Text of about ``n_tokens`` tokens (BOS included) cut from the prose at ``offset``."""
    k = n_tokens - 1
    seq = (ids * (1 + (offset + k) // len(ids)))[offset : offset + k]
    return tokenizer.decode(seq)


def run_server(model_dir: str, reps: int, out: Path, what: set[str]) -> list[dict]:
    import asyncio

    from vllm.transformers_utils.tokenizer import get_tokenizer

    tok = get_tokenizer(model_dir)
    ids = prose_ids(tok)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    app, eng, args = build_server(model_dir, ids[5000:])
    rows, crows = [], []

    def request_body(text: str, n_out: int) -> bytes:
        return json.dumps(
            {
                "model": model_dir,
                "prompt": text,
                "max_tokens": n_out,
                "stream": True,
                "ignore_eos": True,
                "temperature": 0.0,
            }
        ).encode()

    async def burst(conc: int, rep: int):
        """``conc`` requests of one shape sent at once; aggregate CPU and wall."""
        bodies = [
            request_body(prompt_text(tok, ids, CONC_PROMPT, offset=7919 * rep + 131 * i),
                         CONC_OUTPUT)
            for i in range(conc)
        ]  # fmt: skip
        chunks = [0]

        def on_chunk(b: bytes):
            chunks[0] += b.count(b'"text"')

        core0 = eng.engine_core.core_cpu_s
        w0, c0 = time.perf_counter(), time.process_time()
        st = await asyncio.gather(*(asgi_post(app, "/v1/completions", b, on_chunk) for b in bodies))
        w1, c1 = time.perf_counter(), time.process_time()
        core = eng.engine_core.core_cpu_s - core0
        assert all(x == 200 for x in st), st
        crows.append(
            dict(
                concurrency=conc,
                rep=rep,
                prompt_tokens=CONC_PROMPT,
                output_tokens=CONC_OUTPUT,
                chunks=chunks[0],
                total_wall_s=w1 - w0,
                total_cpu_s=c1 - c0,
                core_cpu_s=core,
                net_cpu_s=c1 - c0 - core,
            )
        )

    async def one(family: int, n_out: int, rep: int, record: bool):
        text = prompt_text(tok, ids, family, offset=997 * rep + 31 * n_out)
        body = request_body(text, n_out)
        first: list[float] = []
        chunks: list[bytes] = []

        def on_chunk(b: bytes):
            if not first:
                first.extend((time.perf_counter(), time.process_time()))
            chunks.append(b)

        core0 = eng.engine_core.core_cpu_s
        w0, c0 = time.perf_counter(), time.process_time()
        status = await asgi_post(app, "/v1/completions", body, on_chunk)
        w1, c1 = time.perf_counter(), time.process_time()
        core = eng.engine_core.core_cpu_s - core0
        assert status == 200, (status, b"".join(chunks)[:300])
        data = [c for c in b"".join(chunks).split(b"\n\n") if c.startswith(b"data: ")]
        assert data[-1] == b"data: [DONE]", data[-1]
        n_tok = sum(1 for c in data[:-1] if json.loads(c[6:])["choices"][0].get("text") is not None)
        p_tok = len(tok.encode(text))
        if record:
            rows.append(
                dict(
                    family=family,
                    rep=rep,
                    prompt_tokens=p_tok,
                    output_tokens=n_out,
                    chunks=n_tok,
                    first_chunk_wall_s=first[0] - w0,
                    first_chunk_cpu_s=first[1] - c0,
                    total_wall_s=w1 - w0,
                    total_cpu_s=c1 - c0,
                    core_cpu_s=core,
                    net_cpu_s=c1 - c0 - core,
                )
            )

    async def main():
        for f in PROMPT_FAMILIES[:3]:  # warm-up: imports, JIT-like caches, the output handler
            await one(f, 16, 99, record=False)
        for rep in range(reps if "server" in what else 0):
            for f in PROMPT_FAMILIES:
                for n in OUTPUT_LENGTHS:
                    await one(f, n, rep, record=True)
        for rep in range(reps if "concurrency" in what else 0):
            for c in CONCURRENCY:
                await burst(c, rep)

    loop.run_until_complete(main())
    if "server" in what:
        write_csv(out / "server.csv", SERVER_COLUMNS, rows)
    if "concurrency" in what:
        write_csv(out / "concurrency.csv", CONC_COLUMNS, crows)
    return rows


# Concurrency diagnostic: bursts of requests of one shape sent at once (not fitted).
CONCURRENCY = [1, 4, 16, 64]
CONC_PROMPT, CONC_OUTPUT = 500, 128
CONC_COLUMNS = [
    "concurrency", "rep", "prompt_tokens", "output_tokens", "chunks", "total_wall_s",
    "total_cpu_s", "core_cpu_s", "net_cpu_s",
]  # fmt: skip


def concurrency_summary(conc_rows: list[dict], fit: dict) -> dict:
    """Median net CPU per request by burst size, and the per-output-token cost it implies
    once the fitted per-request and per-prompt-token parts are taken out."""
    outd = {}
    for c in sorted({r["concurrency"] for r in conc_rows}):
        rs = [r for r in conc_rows if r["concurrency"] == c]
        per_req = statistics.median(r["net_cpu_s"] / c for r in rs)
        fixed = fit["per_request_s"] + fit["per_prompt_token_s"] * rs[0]["prompt_tokens"]
        outd[str(int(c))] = {
            "net_cpu_per_request_s": per_req,
            "implied_per_output_token_s": (per_req - fixed) / rs[0]["output_tokens"],
            "wall_per_request_s": statistics.median(r["total_wall_s"] / c for r in rs),
        }
    return outd


# --- tokenisation alone ------------------------------------------------------------------------
TOKENIZE_COLUMNS = ["family", "rep", "prompt_tokens", "chars", "encode_wall_s", "encode_cpu_s"]


def run_tokenize(model_dir: str, reps: int, out: Path) -> list[dict]:
    """``tokenizer.encode(prompt)`` through vLLM's tokenizer getter (the call the completion
    handler makes for a text prompt), one prompt at a time, median of ``inner`` calls."""
    from vllm.transformers_utils.tokenizer import get_tokenizer

    tok = get_tokenizer(model_dir)
    ids = prose_ids(tok)
    rows = []
    for rep in range(reps):
        for f in PROMPT_FAMILIES:
            text = prompt_text(tok, ids, f, offset=1009 * rep)
            inner = max(3, 20000 // f)
            walls, cpus = [], []
            for _ in range(inner):
                w0, c0 = time.perf_counter(), time.process_time()
                n = len(tok.encode(text))
                walls.append(time.perf_counter() - w0)
                cpus.append(time.process_time() - c0)
            rows.append(
                dict(
                    family=f,
                    rep=rep,
                    prompt_tokens=n,
                    chars=len(text),
                    encode_wall_s=statistics.median(walls),
                    encode_cpu_s=statistics.median(cpus),
                )
            )
    write_csv(out / "tokenize.csv", TOKENIZE_COLUMNS, rows)
    return rows


def write_csv(path: Path, cols: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.9g}" if isinstance(v, float) else v) for k, v in r.items()})


# --- fit -----------------------------------------------------------------------------------
def read_csv(path: Path) -> list[dict]:
    with open(path) as f:
        return [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]


def fit_frontend(server_rows: list[dict]) -> dict:
    """Least squares of the per-request net CPU (engine-core share subtracted) on
    [1, prompt_tokens, output_tokens]; the held-out check leaves one prompt-length family out.
    The test in tests/calibrate recomputes this from server.csv."""
    x = np.array([[1.0, r["prompt_tokens"], r["output_tokens"]] for r in server_rows])
    y = np.array([r["net_cpu_s"] for r in server_rows])
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    fams = sorted({r["family"] for r in server_rows})
    fam = np.array([r["family"] for r in server_rows])
    errs, per_family = [], {}
    for f in fams:
        tr, te = fam != f, fam == f
        c = np.linalg.lstsq(x[tr], y[tr], rcond=None)[0]
        e = np.abs(x[te] @ c - y[te]) / y[te]
        per_family[str(int(f))] = float(e.mean())
        errs.extend(e.tolist())
    return {
        "per_request_s": float(coef[0]),
        "per_prompt_token_s": float(coef[1]),
        "per_output_token_s": float(coef[2]),
        "heldout_mape": float(np.mean(errs)),
        "heldout_mape_by_family": per_family,
        "n": len(server_rows),
    }


def fit_first_chunk(server_rows: list[dict]) -> dict:
    """CPU from request to the first streamed chunk on [1, prompt_tokens] (single-token
    requests excluded: their first chunk is also their last)."""
    rs = [r for r in server_rows if r["output_tokens"] > 1]
    x = np.array([[1.0, r["prompt_tokens"]] for r in rs])
    y = np.array([r["first_chunk_cpu_s"] for r in rs])
    c = np.linalg.lstsq(x, y, rcond=None)[0]
    return {"intercept_s": float(c[0]), "per_prompt_token_s": float(c[1]), "n": len(rs)}


def subsequent_tokens(server_rows: list[dict]) -> dict:
    """Per streamed token after the first: (total - first chunk) / (output_tokens - 1), the
    median over requests with 64+ tokens, by prompt family (CPU with the core's share out, and
    wall); plus the fit with a prompt x output interaction term, as a diagnostic."""
    by: dict[str, dict] = {}
    for f in sorted({r["family"] for r in server_rows}):
        rs = [r for r in server_rows if r["family"] == f and r["output_tokens"] >= 64]
        cpu = [(r["net_cpu_s"] - r["first_chunk_cpu_s"]) / (r["output_tokens"] - 1) for r in rs]
        wall = [
            (r["total_wall_s"] - r["first_chunk_wall_s"]) / (r["output_tokens"] - 1) for r in rs
        ]
        by[str(int(f))] = {"cpu_s": statistics.median(cpu), "wall_s": statistics.median(wall)}
    x = np.array(
        [
            [1.0, r["prompt_tokens"], r["output_tokens"], r["prompt_tokens"] * r["output_tokens"]]
            for r in server_rows
        ]
    )
    y = np.array([r["net_cpu_s"] for r in server_rows])
    c = np.linalg.lstsq(x, y, rcond=None)[0]
    return {
        "by_family": by,
        "interaction_fit": {
            "per_request_s": float(c[0]),
            "per_prompt_token_s": float(c[1]),
            "per_output_token_s": float(c[2]),
            "per_prompt_x_output_token_s": float(c[3]),
        },
    }


def fit_tokenize(rows: list[dict]) -> dict:
    x = np.array([[1.0, r["prompt_tokens"]] for r in rows])
    y = np.array([r["encode_cpu_s"] for r in rows])
    c = np.linalg.lstsq(x, y, rcond=None)[0]
    chars = sum(r["chars"] for r in rows) / sum(r["prompt_tokens"] for r in rows)
    return {
        "intercept_s": float(c[0]),
        "per_prompt_token_s": float(c[1]),
        "chars_per_token": float(chars),
        "n": len(rows),
    }


def machine_meta() -> dict:
    import importlib.metadata as md

    cpu = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            k, _, v = line.partition(":")
            k = k.strip()
            if k in ("model name", "cpu family", "model", "stepping") and k not in cpu:
                cpu[k] = v.strip()
    except OSError:
        pass
    vers = {}
    for p in (
        "vllm",
        "torch",
        "transformers",
        "tokenizers",
        "fastapi",
        "starlette",
        "pydantic",
        "msgspec",
        "numpy",
    ):
        try:
            vers[p] = md.version(p)
        except md.PackageNotFoundError:
            vers[p] = None
    return {
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpu": cpu,
        "nproc": os.cpu_count(),
        "loadavg": list(os.getloadavg()),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "versions": vers,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer-dir", default=None, help="where to build/keep the tokenizer")
    ap.add_argument("--what", default="tokenizer,tokenize,server,concurrency,fit")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    what = set(a.what.split(","))
    tdir = a.tokenizer_dir or os.path.join(tempfile_dir(), "llama3-shaped-bpe")
    meta_path = out / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    if "tokenizer" in what or not Path(tdir, "tokenizer.json").exists():
        t0 = time.perf_counter()
        build_tokenizer(tdir)
        meta["tokenizer"] = dict(
            json.loads(Path(tdir, "corpus.json").read_text()), train_wall_s=time.perf_counter() - t0
        )
    load0 = list(os.getloadavg())
    if "tokenize" in what:
        run_tokenize(tdir, a.reps, out)
    if what & {"server", "concurrency"}:
        run_server(tdir, a.reps, out, what)
    meta.update(machine_meta())
    meta["loadavg_at_start"] = load0
    if "fit" in what and (out / "server.csv").exists():
        meta["fit"] = fit_frontend(read_csv(out / "server.csv"))
        meta["first_chunk_fit"] = fit_first_chunk(read_csv(out / "server.csv"))
        meta["subsequent_tokens"] = subsequent_tokens(read_csv(out / "server.csv"))
        if (out / "concurrency.csv").exists():
            meta["concurrency"] = concurrency_summary(
                read_csv(out / "concurrency.csv"), meta["fit"]
            )
    if "fit" in what and (out / "tokenize.csv").exists():
        meta["tokenize_fit"] = fit_tokenize(read_csv(out / "tokenize.csv"))
    meta["prompt_families"], meta["output_lengths"] = PROMPT_FAMILIES, OUTPUT_LENGTHS
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    print(
        json.dumps(
            {k: meta.get(k) for k in ("fit", "first_chunk_fit", "concurrency", "tokenize_fit")},
            indent=1,
        )
    )


def tempfile_dir() -> str:
    import tempfile

    return tempfile.gettempdir()


if __name__ == "__main__":
    sys.exit(main())
