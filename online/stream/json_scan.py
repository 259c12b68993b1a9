"""The common JSON record read in one compiled pass: a batch's field values without a Python object per record.

``orjson.loads`` builds every key, number and string of a record (about 1.4 us for a 100-byte session on
this machine, where the SGNS kernel spends about 1.3 us per token): for sessions of a few IDs, parsing
with it would cost a fifth of the pipeline. ``scan_records`` validates each record of a batch and finds the
field of ``LIVEVEC_RECORD_FIELD`` in one pass over the bytes, and copies the fields into one buffer (a
list's items as a token-list record, ``TokenList``), decoded once for the batch, so a record costs one slice.

It decides only what it is sure of: a record is ``OK`` (the field is a string, or a list of strings, and
the whole record is valid JSON) or ``EMPTY`` (a list whose items are all empty, or blanks alone), and
anything else is ``FALLBACK``: not valid JSON, no such field, another type, and everything this scan does
not handle (escapes in strings, numbers with an exponent or more than 15 digits, a key of the path twice in
one object, nesting deeper than 64). ``RecordFormat.extract`` reads those with orjson, so every verdict on a
malformed record, and every odd valid one, is orjson's (``tests/test_records.py`` compares both on
generated and mutated records).

Three things make it fast (about 1.3 ns a byte on 110-byte sessions): the whitespace test puts ``c > 0x20``
first; the records' loop is inside the compiled function, not a call per record; and the open containers are
bits of integers, not small arrays, since each array a compiled call takes or a loop touches adds reference
counting per record (about 100 ns in all).
"""
from __future__ import annotations

import numpy as np
from numba import njit

FALLBACK, OK_STRING, OK_LIST, EMPTY = 0, 1, 2, 3
_MAX_DEPTH = 64
_MAX_DIGITS = 15

# parser states
_KEY_OR_END, _KEY, _COLON, _VALUE, _VALUE_OR_END, _AFTER_VALUE = 0, 1, 2, 3, 4, 5


@njit(inline="always")
def _skip_ws(data, i, end):
    """The first byte at or after ``i`` that is not JSON whitespace (``c > 0x20`` settles most calls at once)."""
    while i < end:
        c = data[i]
        if c > 0x20 or (c != 0x20 and c != 0x09 and c != 0x0A and c != 0x0D):
            return i
        i += 1
    return i


@njit(inline="always")
def _string_end(data, i, end):
    """Index of the closing quote of the string opening at ``i``; -1 for an escape, a control byte or no end."""
    j = i + 1
    while j < end:
        c = data[j]
        if c == 0x22:
            return j
        if c == 0x5C or c < 0x20:
            return -1
        j += 1
    return -1


@njit(inline="always")
def _literal(data, i, end, word):
    if i + word.shape[0] > end:
        return -1
    for k in range(word.shape[0]):
        if data[i + k] != word[k]:
            return -1
    return i + word.shape[0]


@njit(inline="always")
def _number_end(data, i, end):
    """End of the number at ``i`` (JSON's grammar without an exponent, at most 15 digits); -1 otherwise."""
    j = i
    if j < end and data[j] == 0x2D:
        j += 1
    if j >= end or not (0x30 <= data[j] <= 0x39):
        return -1
    digits = 0
    if data[j] == 0x30:
        j += 1
        digits = 1
    else:
        while j < end and 0x30 <= data[j] <= 0x39:
            j += 1
            digits += 1
    if j < end and data[j] == 0x2E:
        j += 1
        frac = 0
        while j < end and 0x30 <= data[j] <= 0x39:
            j += 1
            frac += 1
        if frac == 0:
            return -1
        digits += frac
    if digits > _MAX_DIGITS or (j < end and (data[j] == 0x65 or data[j] == 0x45)):
        return -1
    return j


@njit(inline="always")
def _key_is(data, a, b, path, path_start, path_end):
    if b - a != path_end - path_start:
        return False
    for k in range(b - a):
        if data[a + k] != path[path_start + k]:
            return False
    return True


@njit(nogil=True, cache=True)
def _scan(data, starts, ends, path, path_ends, status, start, length, items_first, items_count, item_start,
          item_len, word_true, word_false, word_null):
    """Each record ``data[starts[r]:ends[r]]``: its status, the field string's ``start``/``length``, or the
    list's items, written to ``item_start``/``item_len`` from ``items_first[r]`` on; returns the items written.

    A failure, or any step that is not what valid JSON has there, leaves the record's loops (``break``)
    with ``status`` FALLBACK."""
    n_path = path_ends.shape[0]
    n_items = 0
    for r in range(ends.shape[0]):
        end = ends[r]
        first = n_items
        st = FALLBACK
        start[r] = 0
        length[r] = 0
        count = 0
        nonempty = 0
        i = _skip_ws(data, starts[r], end)
        if i >= end:           # blanks alone
            st = EMPTY
        elif data[i] == 0x7B:
            depth = 1
            # the open containers as bits of integers, bit d for depth d (at most _MAX_DEPTH): arrays (else
            # objects), and the path's keys met; the objects on the path are depths 1 to path_level
            arrays = 0
            seen = 0
            path_level = 1
            state = _KEY_OR_END
            pending = 0            # 1: the next value is an object on the path; 2: the next value is the field
            found = 0              # OK_STRING or OK_LIST once the field was read
            ok = False             # the record's object closed
            i += 1
            while True:
                i = _skip_ws(data, i, end)
                if i >= end:
                    break
                c = data[i]
                if state == _KEY_OR_END or state == _KEY:
                    if c == 0x7D and state == _KEY_OR_END:   # an empty object: closed as after a value
                        state = _AFTER_VALUE
                        continue
                    if c != 0x22:
                        break
                    j = _string_end(data, i, end)
                    if j < 0:
                        break
                    pending = 0
                    if depth <= path_level and depth <= n_path:
                        ps = path_ends[depth - 2] if depth >= 2 else 0
                        if _key_is(data, i + 1, j, path, ps, path_ends[depth - 1]):
                            if (seen >> depth) & 1:
                                break
                            seen |= 1 << depth
                            pending = 2 if depth == n_path else 1
                    i = j + 1
                    state = _COLON
                elif state == _COLON:
                    if c != 0x3A:
                        break
                    i += 1
                    state = _VALUE
                elif state == _VALUE or state == _VALUE_OR_END:
                    if c == 0x5D and state == _VALUE_OR_END:   # an empty array: the same
                        state = _AFTER_VALUE
                        continue
                    if c == 0x22:
                        j = _string_end(data, i, end)
                        if j < 0 or pending == 1:
                            break
                        if pending == 2:
                            found = OK_STRING
                            start[r] = i + 1
                            length[r] = j - i - 1
                        i = j + 1
                    elif (c == 0x7B or c == 0x5B) and ((pending == 2 and c == 0x7B) or (pending == 1 and c == 0x5B)
                                                     or depth + 1 >= _MAX_DEPTH):
                        break
                    elif c == 0x5B and pending == 2:
                        # the field's list, read here in one loop (the hot path of an ID stream): strings
                        # separated by commas, and anything else is orjson's to judge
                        found = OK_LIST
                        i = _skip_ws(data, i + 1, end)
                        listed = False
                        if i < end and data[i] == 0x5D:
                            i += 1
                            listed = True
                        else:
                            while i < end and data[i] == 0x22:
                                j = _string_end(data, i, end)
                                if j < 0:
                                    break
                                item_start[n_items] = i + 1
                                item_len[n_items] = j - i - 1
                                n_items += 1
                                count += 1
                                if j > i + 1:
                                    nonempty += 1
                                i = _skip_ws(data, j + 1, end)
                                if i >= end:
                                    break
                                if data[i] == 0x5D:
                                    i += 1
                                    listed = True
                                    break
                                if data[i] != 0x2C:
                                    break
                                i = _skip_ws(data, i + 1, end)
                        if not listed:
                            break
                    elif c == 0x7B or c == 0x5B:
                        depth += 1
                        if c == 0x5B:
                            arrays |= 1 << depth
                        else:
                            arrays &= ~(1 << depth)
                        if pending == 1:
                            path_level = depth
                            seen &= ~(1 << depth)
                        pending = 0
                        state = _KEY_OR_END if c == 0x7B else _VALUE_OR_END
                        i += 1
                        continue
                    else:
                        if pending != 0:
                            break
                        if c == 0x74:
                            j = _literal(data, i, end, word_true)
                        elif c == 0x66:
                            j = _literal(data, i, end, word_false)
                        elif c == 0x6E:
                            j = _literal(data, i, end, word_null)
                        else:
                            j = _number_end(data, i, end)
                        if j < 0:
                            break
                        i = j
                    pending = 0
                    state = _AFTER_VALUE
                else:   # _AFTER_VALUE
                    if c == 0x2C:
                        state = _VALUE if (arrays >> depth) & 1 else _KEY
                        i += 1
                    elif c == (0x5D if (arrays >> depth) & 1 else 0x7D):
                        if depth == path_level:
                            path_level -= 1
                        depth -= 1
                        i += 1
                        if depth == 0:
                            ok = True
                            break
                    else:
                        break
            if ok and found != 0 and _skip_ws(data, i, end) == end:
                st = EMPTY if found == OK_LIST and nonempty == 0 else found
        status[r] = st
        items_first[r] = first
        items_count[r] = count if st == OK_LIST else 0
        if st != OK_LIST:
            n_items = first        # a list's items are kept only for a record read in full
    return n_items


@njit(nogil=True, cache=True)
def _gather(data, status, start, length, items_first, items_count, item_start, item_len, out):
    """Each record's field into ``out``, and U+001D after each but the last: a string as it is, a list as a
    token list (U+001E, then the items separated by U+001F). No field read holds a control character (the
    scan leaves those to orjson), so one ``split`` of the decoded batch gives every record its field."""
    pos = 0
    for r in range(status.shape[0]):
        if r > 0:
            out[pos] = 0x1D
            pos += 1
        st = status[r]
        if st == OK_STRING:
            src = start[r]
            for m in range(length[r]):     # byte loops: a slice here is an array view, counted per record
                out[pos + m] = data[src + m]
            pos += length[r]
        elif st == OK_LIST:
            out[pos] = 0x1E
            pos += 1
            for k in range(items_first[r], items_first[r] + items_count[r]):
                if k > items_first[r]:
                    out[pos] = 0x1F
                    pos += 1
                src = item_start[k]
                for m in range(item_len[k]):
                    out[pos + m] = data[src + m]
                pos += item_len[k]
    return pos


_TRUE = np.frombuffer(b"true", dtype=np.uint8)
_FALSE = np.frombuffer(b"false", dtype=np.uint8)
_NULL = np.frombuffer(b"null", dtype=np.uint8)


def scan_records(values: list[bytes], path: tuple[str, ...]) -> tuple[list[int], list[str]] | None:
    """(status of each of ``values``, its field): for ``OK_STRING`` the string, for ``OK_LIST`` the items
    as a token list, else ``""``; None when a value is not UTF-8. See the module docstring."""
    data = b"\n".join(values)        # an ASCII byte between values: no character spans two
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    raw = np.frombuffer(data, dtype=np.uint8)
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    ends = np.cumsum(lengths + 1) - 1
    starts = ends - lengths
    keys = [p.encode("utf-8") for p in path]
    path_bytes = np.frombuffer(b"".join(keys), dtype=np.uint8) if any(keys) else np.zeros(0, dtype=np.uint8)
    path_ends = np.cumsum(np.array([len(k) for k in keys], dtype=np.int64))
    n = len(values)
    status = np.empty(n, dtype=np.int64)
    start = np.empty(n, dtype=np.int64)
    length = np.empty(n, dtype=np.int64)
    items_first = np.empty(n, dtype=np.int64)
    items_count = np.empty(n, dtype=np.int64)
    cap = len(data) // 3 + 1          # an item takes at least 3 bytes: "",
    item_start = np.empty(cap, dtype=np.int64)
    item_len = np.empty(cap, dtype=np.int64)
    _scan(raw, starts, ends, path_bytes, path_ends, status, start, length, items_first, items_count, item_start,
          item_len, _TRUE, _FALSE, _NULL)
    out = np.empty(len(data) + n + 1, dtype=np.uint8)
    used = _gather(raw, status, start, length, items_first, items_count, item_start, item_len, out)
    return status.tolist(), str(out[:used].data, "utf-8").split("\x1d")
