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


def test_pruning_deletes_the_tokens_of_checkpointed_steps_and_keeps_the_newest_epoch(tmp_path):
    tokens, seen = TokenStore(str(tmp_path)), []
    sink = CallSink(lambda k, v: seen.append((k, v)))
    for step, epoch in enumerate([1, 2, 2]):
        sink.publish("sink_3", step, epoch, [message("f", step, step)], tokens)
    assert tokens.prune(3) == 3  # steps 0..2 are checkpointed
    assert tokens.prune(3) == 0
    rows = DeltaTable(tokens.uri).to_pyarrow_table().to_pylist()
    assert [(r["stage"], r["epoch"]) for r in rows] == [("_epoch", 2)]  # no token of a step below 3
    with pytest.raises(StaleEpochError, match="epoch 1 is older than epoch 2"):
        sink.publish("sink_3", 3, 1, [message("m", 3, 7)], tokens)
    sink.publish("sink_3", 3, 3, [message("m", 3, 7)], tokens)
    sink.publish("sink_3", 4, 3, [message("m", 4, 8)], tokens)
    assert tokens.prune(4) == 2  # step 3's token and the old epoch record; step 4's token has the newest epoch
    assert [(r["stage"], r["step"]) for r in DeltaTable(tokens.uri).to_pyarrow_table().to_pylist()] == [("sink_3", 4)]
    sink.publish("sink_3", 4, 3, [message("m", 4, 8)], tokens)  # a replay of step 4 still skips it
    assert seen == [("f", 0), ("f", 1), ("f", 2), ("m", 7), ("m", 8)]
