"""How delivery cuts a source's bytes into messages: whole records, over-long ones in marked
pieces, nothing lost or reordered (pure logic: no broker)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.delivery import _Source, cut
from gateway.gateway import resume_positions
from storage.cursors import Cursors

SIZE = 16


@settings(max_examples=300, deadline=None)
@given(
    records=st.lists(st.binary(min_size=0, max_size=40).map(lambda b: b.replace(b"\n", b"x")), max_size=30),
    cuts=st.lists(st.integers(1, SIZE), min_size=1, max_size=200),
)
def test_messages_hold_whole_records_and_pieces_of_long_ones(records, cuts):
    stream = b"".join(r + b"\n" for r in records)
    state, position, sent, reads = _Source("t", 0, True), 0, [], iter(cuts * (len(stream) + 1))
    while position < len(stream):
        data = stream[position : position + next(reads)]  # what one buffer got
        first = position - len(state.tail)
        sent += list(cut(state, state.tail + data, first, SIZE))
        position += len(data)
    # Nothing lost, duplicated or reordered; each message starts where the previous ended.
    assert b"".join(v for v, _, _ in sent) + state.tail == stream
    assert [s for _, s, _ in sent] == [sum(len(v) for v, _, _ in sent[:i]) for i in range(len(sent))]
    assert state.tail == b""
    # Read back as the step frames them: whole records, and over-long ones from their pieces.
    framed, piece = [], b""
    for value, _, partial in sent:
        if partial:
            piece += value
            if piece.endswith(b"\n"):
                framed.append((piece[:-1], True))
                piece = b""
        else:
            assert value.endswith(b"\n") and not piece, "a whole-records message holds whole records"
            framed += [(line, False) for line in value.split(b"\n")[:-1]]
    assert [r for r, _ in framed] == records
    # Only a record that outgrew a buffer is marked; every shorter one arrives whole.
    assert all(len(r) >= SIZE for r, marked in framed if marked)


def test_a_restart_resumes_after_the_contiguous_acknowledged_ranges():
    committed = Cursors({("t", "a"): 10, ("t", "b"): 5}, {})
    acknowledged = {("t", "a"): {10: 20, 20: 35, 50: 60}, ("t", "c"): {0: 7}}
    # a: 10..35 continue its cursor, 50..60 lies past a gap (re-read from 35); c is new.
    assert resume_positions(committed, acknowledged) == {("t", "a"): 35, ("t", "b"): 5, ("t", "c"): 7}
