"""KLogs sinks on Delta: tokens make each side effect happen once; an older epoch is refused."""

import pytest
from deltalake import DeltaTable

from storage.sinks import CallSink, DeltaSink, Message, StaleEpochError, TokenStore


def message(key: str, offset: int, value) -> Message:
    return Message(f'"{key}"', f"0.0.{offset}.0", key, value)


def test_a_function_sink_skips_the_tokens_it_completed(tmp_path):
    tokens, seen = TokenStore(str(tmp_path)), []
    sink = CallSink(lambda k, v: seen.append((k, v)))
    sink.publish("sink_3", 0, 1, [message("f", 0, 1), message("m", 1, 3)], tokens)
    sink.publish("sink_3", 0, 2, [message("f", 0, 1), message("m", 1, 3), message("f", 2, 5)], tokens)  # a replay
    assert seen == [("f", 1), ("m", 3), ("f", 5)]
    with pytest.raises(StaleEpochError, match="epoch 1 is older than epoch 2"):
        sink.publish("sink_3", 1, 1, [message("m", 3, 7)], tokens)
    assert seen == [("f", 1), ("m", 3), ("f", 5)]


def test_a_delta_sink_writes_each_message_once_and_refuses_an_older_epoch(tmp_path):
    uri, tokens = str(tmp_path / "out"), TokenStore(str(tmp_path))
    sink = DeltaSink(uri)
    sink.publish("sink_3", 0, 5, [message("f", 0, 1)], tokens)
    sink.publish("sink_3", 0, 6, [message("f", 0, 1), message("m", 1, 3)], tokens)
    rows = sorted((r["key"], r["value"], r["epoch"]) for r in DeltaTable(uri).to_pyarrow_table().to_pylist())
    assert rows == [('"f"', "1", 5), ('"m"', "3", 6)]
    with pytest.raises(StaleEpochError):
        sink.publish("sink_3", 1, 5, [message("m", 2, 4)], tokens)
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 2


def test_a_message_the_sink_function_raises_on_is_a_dead_letter(tmp_path):
    tokens, seen = TokenStore(str(tmp_path)), []

    def fussy(key, value):
        if value == 3:
            raise ValueError("three")
        seen.append(value)

    messages = [message("f", 0, 1), message("m", 1, 3), message("f", 2, 5)]
    CallSink(fussy).publish("sink_3", 0, 1, messages, tokens)
    CallSink(fussy).publish("sink_3", 0, 1, messages, tokens)
    assert seen == [1, 5]
    [dead] = DeltaTable(str(tmp_path / "_sink_dead_letters")).to_pyarrow_table().to_pylist()
    assert (dead["key"], dead["offset"], dead["reason"]) == ('"m"', "0.0.1.0", "ValueError: three")
