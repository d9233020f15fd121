"""APO's readable copy of span files (``trainer/loop/apo/transcripts.py``, ``TextCopy``): made
once for a set of files and shared while none of them changes, from the whole set (a session's
traces may be in several files), made again when a file comes or changes, removed at the
end."""

import os
from pathlib import Path

import pyarrow.parquet as pq

from agl_bridge.trainer.loop.apo import transcripts
from agl_bridge.trainer.loop.apo.transcripts import TextCopy, converted_rewards, text_traces
from tests.factories import llm, openinference_call, reward, table


def session_file(path: Path, session: str, k: int, answer: str, value: float | None) -> Path:
    """One trace of ``session`` (a hosted API's call, as OpenInference records it: no token
    ids, no episode), with a reward span when ``value`` is set."""
    trace = f"{session}{k}".ljust(32, "a")
    rows = [openinference_call(trace, 10 * k, session, "say 40", answer)]
    if value is not None:
        rows.append(reward(None, 10 * k + 5, value, trace=trace))
    pq.write_table(table(rows), path)
    return path


def test_one_copy_while_the_files_are_unchanged_and_a_new_one_when_they_change(tmp_path,
                                                                              monkeypatch):
    made = []

    def spy(source):
        made.append(source)
        return real(source)

    real = transcripts.text_traces
    monkeypatch.setattr(transcripts, "text_traces", spy)
    # session s0 spans two files: its reward is in the second, its first call in the first
    files = [session_file(tmp_path / "a.parquet", "s0", 0, "40", None),
             session_file(tmp_path / "b.parquet", "s0", 1, "40", 1.0)]
    with TextCopy() as copy:
        readable, n = copy.of(files)
        assert copy.of([str(f) for f in files]) == (readable, n)  # read once, shared
        assert len(made) == 1 and n == 2
        assert converted_rewards(readable) == {"session:s0": 1.0}  # one episode, both files
        with text_traces(files) as (direct, _):  # what each reader made for itself before
            assert pq.read_table(Path(readable) / "spans.parquet").equals(
                pq.read_table(Path(direct) / "spans.parquet"))

        files.append(session_file(tmp_path / "c.parquet", "s1", 0, "hello", 0.0))  # it came
        again, n = copy.of(files)
        assert len(made) == 2 and n == 3 and not Path(readable).exists()  # the old one gone
        assert converted_rewards(again) == {"session:s0": 1.0, "session:s1": 0.0}

        st = files[0].stat()  # the same size, a later modification time: read again
        os.utime(files[0], ns=(st.st_atime_ns, st.st_mtime_ns + 1))
        last, _ = copy.of(files)
        assert len(made) == 3 and not Path(again).exists()
    assert not Path(last).exists()  # removed at the end


def test_files_that_need_no_copy_are_read_once_too(tmp_path, monkeypatch):
    """Our own calls with token ids: ``text_traces`` gives the files back as they are; they
    are still read (and normalised) once while unchanged."""
    made = []
    real = transcripts.text_traces
    monkeypatch.setattr(transcripts, "text_traces", lambda s: made.append(s) or real(s))
    pq.write_table(table([llm("e1", 1), reward("e1", 2, 0.5)]), tmp_path / "spans.parquet")
    with TextCopy() as copy:
        assert copy.of(tmp_path) == (tmp_path, 0) and copy.of(tmp_path) == (tmp_path, 0)
        assert converted_rewards(tmp_path) == {"e1": 0.5}
    assert len(made) == 1 and (tmp_path / "spans.parquet").exists()  # never removed
