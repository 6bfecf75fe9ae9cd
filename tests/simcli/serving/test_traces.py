"""Public trace formats read by column mapping (simcli.serving.traces), on the hand-written
samples of examples/traces (not public data)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simcli.serving.requests import TraceError
from simcli.serving.traces import detect_format, trace_source

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "traces"


def _rows(name: str, fmt: str = "auto", **kw):
    src = trace_source(EXAMPLES / name, fmt, **kw)
    return src, [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in src.requests()]


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("simcli_trace.csv", "simcli"),
        ("azure_llm_inference.csv", "azure"),
        ("mooncake.jsonl", "mooncake"),
        ("burstgpt.csv", "burstgpt"),
        ("vidur_trace.csv", "vidur"),
        ("vidur_lengths.csv", "vidur"),
    ],
)
def test_auto_detects_each_format(name, fmt):
    assert detect_format(EXAMPLES / name) == fmt


def test_azure_date_times_become_seconds_from_the_first_row():
    src, rows = _rows("azure_llm_inference.csv")
    assert src.format == "azure"
    # row 6 (0 context tokens) is skipped; times relative to 00:00:00.0
    assert [r[0] for r in rows] == pytest.approx([0.0, 0.251, 0.734, 1.002, 1.002, 2.445, 3.1])
    assert rows[0][1:] == (812, 96) and rows[-1][1:] == (2048, 8)


def test_mooncake_milliseconds_and_lengths():
    _, rows = _rows("mooncake.jsonl")
    assert rows == [(0.0, 6144, 210), (0.0, 3100, 95), (0.85, 700, 40), (1.9, 9000, 388),
                    (2.4, 1500, 12), (4.1, 512, 300)]  # fmt: skip


def test_burstgpt_skips_failed_requests():
    _, rows = _rows("burstgpt.csv")
    assert len(rows) == 6  # the row with 0 response tokens (a failure) is skipped
    assert rows[0] == (0.0, 472, 18) and rows[1] == (41.0, 198, 344)


def test_vidur_trace_and_its_length_only_files():
    _, rows = _rows("vidur_trace.csv")
    assert rows[2] == (0.35, 5120, 22)
    src = trace_source(EXAMPLES / "vidur_lengths.csv")
    p, o = src.lengths()  # lengths resample with --qps
    assert p.tolist() == [3100, 2450, 3890, 1720, 2990] and o.tolist() == [180, 95, 202, 130, 410]
    with pytest.raises(TraceError, match="no column 'arrived_at'.*--qps"):
        src.check(need_arrivals=True)


def test_generic_csv_by_column_mapping_and_time_unit():
    cols = "arrival=sent_ms,prompt=in_tok,output=out_tok"
    src, rows = _rows("custom.csv", columns=cols, unit="ms")
    assert src.format == "csv"
    assert rows[:3] == [(0.0, 350, 120), (0.12, 1024, 64), (0.125, 80, 400)]
    _, in_s = _rows("custom.csv", "csv", columns=cols, unit="s")
    assert in_s[3][0] == pytest.approx(980.0)
    # without an arrival column: lengths only
    p, o = trace_source(EXAMPLES / "custom.csv", "csv", columns="prompt=in_tok,output=out_tok")\
        .lengths()  # fmt: skip
    assert p.tolist() == [350, 1024, 80, 2200, 640] and o.tolist()[-1] == 256


def test_simcli_format_still_replays_as_before():
    _, rows = _rows("simcli_trace.csv")
    assert rows == [(0.0, 512, 128), (0.4, 900, 64), (0.45, 128, 256), (1.3, 2048, 32)]


@pytest.mark.parametrize(
    ("text", "fmt", "kw", "message"),
    [
        # a missing column: named, with the ones present
        ("TIMESTAMP,ContextTokens\n2024-01-01 00:00:00,5\n", "azure", {},
         r"no column 'GeneratedTokens'; its columns: TIMESTAMP,ContextTokens"),
        ("a,b,c\n1,2,3\n", "csv", {"columns": "arrival=a,prompt=b,output=z"},
         r"no column 'z'; its columns: a,b,c"),
        ('{"timestamp": 0, "input_length": 5}\n', "mooncake", {},
         r"no key 'output_length'; its keys: timestamp, input_length"),
        ("x,y\n1,2\n", "auto", {}, r"has columns 'x,y', no known format; allowed: simcli"),
        ("Timestamp,Request tokens,Response tokens\n5,10,3\n2,10,3\n", "burstgpt", {},
         "line 3: Timestamp is before the previous row's"),
        ("Timestamp,Request tokens,Response tokens\n5,ten,3\n", "burstgpt", {},
         "line 2: Request tokens 'ten' is invalid"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,5\n", "azure", {},
         "line 2: TIMESTAMP 'yesterday' is not a date-time"),
        ("a,b\n1,2\n", "csv", {"columns": "prompt=a"}, "names no output column"),
        ("a,b\n1,2\n", "csv", {"columns": "prompt=a,output=b,tokens=a"}, "bad item 'tokens=a'"),
        ("a,b\n1,2\n", "csv", {"columns": "prompt=a,output=b", "unit": "h"},
         "unknown --trace-time-unit 'h'"),
        ("Timestamp,Request tokens,Response tokens\n5,10,0\n", "burstgpt", {},
         "no requests"),
    ],
)  # fmt: skip
def test_bad_traces_are_one_line(tmp_path, text, fmt, kw, message):
    path = tmp_path / ("t.jsonl" if fmt == "mooncake" else "t.csv")
    path.write_text(text)
    with pytest.raises(TraceError, match=message) as info:
        src = trace_source(path, fmt, **kw)
        src.check(need_arrivals=kw.get("columns", "arrival") is not None)
        list(src.requests())
    assert "\n" not in str(info.value)


def test_replay_is_streamed_and_capped(tmp_path):
    path = tmp_path / "big.csv"
    n = 10_000
    t = np.arange(n) * 0.01
    lines = ["arrived_at,num_prefill_tokens,num_decode_tokens"]
    lines += [f"{a:.2f},{100 + i % 50},{1 + i % 7}" for i, a in enumerate(t)]
    path.write_text("\n".join(lines) + "\n")
    src = trace_source(path)
    stream = src.requests(6000)
    assert stream.expected == 6000
    chunks = list(stream.chunks())
    assert [len(c.arrival_s) for c in chunks] == [4096, 1904]  # read 4096 rows at a time
    assert chunks[1].first_id == 4096 and chunks[1].arrival_s[0] == pytest.approx(40.96)
    assert src.requests().expected == n


def test_csv_date_times(tmp_path):
    path = tmp_path / "dt.csv"
    path.write_text("when,p,o\n2025-01-01 10:00:00,5,6\n2025-01-01 10:00:01.5,7,8\n")
    src = trace_source(path, "csv", columns="arrival=when,prompt=p,output=o", unit="datetime")
    assert [(r.arrival_s, r.prompt_tokens) for r in src.requests()] == [(0.0, 5), (1.5, 7)]


def test_public_trace_replays_take_the_compiled_loop():
    from simcli.scenario.serving import resolve_serve
    from simcli.scenario.serving_options import ServeOptions
    from simcli.serving import fastpath

    o = ServeOptions(model="llama3-8b", gpu="h100-sxm", trace=EXAMPLES / "burstgpt.csv")
    sc = resolve_serve(o)
    reqs = sc.arrivals.requests()
    assert sc.arrivals.source is not None and sc.arrivals.source.format == "burstgpt"
    assert fastpath.eligible(sc.simulator(), reqs) == fastpath.HAVE_NUMBA
    assert sc.simulator().run(reqs, compiled=True).summary["requests_completed"] == 6
