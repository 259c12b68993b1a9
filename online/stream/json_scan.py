"""The common JSON record read in one compiled pass: a batch's field values without a Python object per record.

``orjson.loads`` builds every key, number and string of a record (about 1.4 us for a 100-byte session on
this machine, where the SGNS kernel spends about 1.3 us per token): for sessions of a few IDs, parsing
alone cost a fifth of the pipeline. ``scan_records`` validates each record of a batch and finds the
field of ``LIVEVEC_RECORD_FIELD`` in one pass over the bytes, and copies the fields into one buffer (a
list's items as a token-list record, ``TokenList``), decoded once for the batch, so a record costs one slice.

It decides only what it is sure of: a record is ``OK`` (the field is a string, or a list of strings, and
the whole record is valid JSON) or ``EMPTY`` (a list whose items are all empty), and anything else is
``FALLBACK``: not valid JSON, no such field, another type, and everything this scan does not handle
(escapes in strings, numbers with an exponent or more than 15 digits, a key of the path twice in one
object, nesting deeper than 64). ``RecordFormat.extract`` reads those with orjson, so every verdict on a
malformed record, and every odd valid one, is orjson's (``tests/test_records.py`` compares both on
generated and mutated records).
"""
from __future__ import annotations

import numpy as np
from numba import njit

FALLBACK, OK_STRING, OK_LIST, EMPTY = 0, 1, 2, 3
_MAX_DEPTH = 64
_MAX_DIGITS = 15

# parser states
_KEY_OR_END, _KEY, _COLON, _VALUE, _VALUE_OR_END, _AFTER_VALUE = 0, 1, 2, 3, 4, 5
_OBJECT, _ARRAY = 1, 2


@njit(inline="always")
def _skip_ws(data, i, end):
    while i < end:
        c = data[i]
        if c != 0x20 and c != 0x09 and c != 0x0A and c != 0x0D:
            break
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
def _scan_one(data, a, end, path, path_ends, kinds, on_path, seen, word_true, word_false, word_null,
              item_start, item_len, n_items):
    """(status, start, length, items, nonempty items, items written) of the record ``data[a:end]``; a list's
    items go to ``item_start``/``item_len`` from ``n_items`` on."""
    n_path = path_ends.shape[0]
    i = _skip_ws(data, a, end)
    if i >= end or data[i] != 0x7B:
        return FALLBACK, 0, 0, 0, 0, n_items
    depth = 1
    kinds[1] = _OBJECT
    on_path[1] = True
    seen[1] = False
    state = _KEY_OR_END
    pending = 0            # 1: the next value is an object on the path; 2: the next value is the field
    found = 0              # OK_STRING or OK_LIST once the field was read
    s_start = 0
    s_len = 0
    target_depth = -1      # depth of the field's list while inside it
    count = 0
    nonempty = 0
    first = n_items
    i += 1
    while True:
        i = _skip_ws(data, i, end)
        if i >= end:
            return FALLBACK, 0, 0, 0, 0, first
        c = data[i]
        if state == _KEY_OR_END or state == _KEY:
            if c == 0x7D and state == _KEY_OR_END:
                depth -= 1
                i += 1
                if depth == 0:
                    break
                state = _AFTER_VALUE
                continue
            if c != 0x22:
                return FALLBACK, 0, 0, 0, 0, first
            j = _string_end(data, i, end)
            if j < 0:
                return FALLBACK, 0, 0, 0, 0, first
            pending = 0
            if on_path[depth] and depth <= n_path:
                ps = path_ends[depth - 2] if depth >= 2 else 0
                if _key_is(data, i + 1, j, path, ps, path_ends[depth - 1]):
                    if seen[depth]:
                        return FALLBACK, 0, 0, 0, 0, first
                    seen[depth] = True
                    pending = 2 if depth == n_path else 1
            i = j + 1
            state = _COLON
        elif state == _COLON:
            if c != 0x3A:
                return FALLBACK, 0, 0, 0, 0, first
            i += 1
            state = _VALUE
        elif state == _VALUE or state == _VALUE_OR_END:
            in_target = depth == target_depth
            if c == 0x5D and state == _VALUE_OR_END:
                if in_target:
                    target_depth = -1
                depth -= 1
                i += 1
                state = _AFTER_VALUE
                continue
            if c == 0x22:
                j = _string_end(data, i, end)
                if j < 0 or pending == 1:
                    return FALLBACK, 0, 0, 0, 0, first
                if pending == 2:
                    found = OK_STRING
                    s_start = i + 1
                    s_len = j - i - 1
                elif in_target:
                    item_start[n_items] = i + 1
                    item_len[n_items] = j - i - 1
                    n_items += 1
                    count += 1
                    if j > i + 1:
                        nonempty += 1
                i = j + 1
            elif c == 0x7B or c == 0x5B:
                if in_target or (pending == 2 and c == 0x7B) or (pending == 1 and c == 0x5B) \
                        or depth + 1 >= _MAX_DEPTH:
                    return FALLBACK, 0, 0, 0, 0, first
                depth += 1
                kinds[depth] = _OBJECT if c == 0x7B else _ARRAY
                on_path[depth] = pending == 1
                seen[depth] = False
                if pending == 2:
                    found = OK_LIST
                    target_depth = depth
                pending = 0
                state = _KEY_OR_END if c == 0x7B else _VALUE_OR_END
                i += 1
                continue
            else:
                if pending != 0 or in_target:
                    return FALLBACK, 0, 0, 0, 0, first
                if c == 0x74:
                    j = _literal(data, i, end, word_true)
                elif c == 0x66:
                    j = _literal(data, i, end, word_false)
                elif c == 0x6E:
                    j = _literal(data, i, end, word_null)
                else:
                    j = _number_end(data, i, end)
                if j < 0:
                    return FALLBACK, 0, 0, 0, 0, first
                i = j
            pending = 0
            state = _AFTER_VALUE
        else:   # _AFTER_VALUE
            if c == 0x2C:
                state = _KEY if kinds[depth] == _OBJECT else _VALUE
                i += 1
            elif (c == 0x7D and kinds[depth] == _OBJECT) or (c == 0x5D and kinds[depth] == _ARRAY):
                if depth == target_depth:
                    target_depth = -1
                depth -= 1
                i += 1
                if depth == 0:
                    break
            else:
                return FALLBACK, 0, 0, 0, 0, first
    if _skip_ws(data, i, end) != end or found == 0:
        return FALLBACK, 0, 0, 0, 0, first
    if found == OK_LIST and nonempty == 0:
        return EMPTY, 0, 0, 0, 0, first
    return found, s_start, s_len, count, nonempty, n_items


@njit(nogil=True, cache=True)
def _scan(data, ends, path, path_ends, status, start, length, items_first, items_count, item_start, item_len,
          word_true, word_false, word_null):
    kinds = np.zeros(_MAX_DEPTH + 1, dtype=np.uint8)
    on_path = np.zeros(_MAX_DEPTH + 1, dtype=np.bool_)
    seen = np.zeros(_MAX_DEPTH + 1, dtype=np.bool_)
    a = 0
    n_items = 0
    for r in range(ends.shape[0]):
        st, s0, sl, cnt, _nonempty, after = _scan_one(data, a, ends[r], path, path_ends, kinds, on_path, seen,
                                                      word_true, word_false, word_null, item_start, item_len,
                                                      n_items)
        status[r] = st
        start[r] = s0
        length[r] = sl
        items_first[r] = n_items
        items_count[r] = cnt if st == OK_LIST else 0
        n_items = after if st == OK_LIST else n_items
        a = ends[r]
    return n_items


@njit(inline="always")
def _copy(data, src, n, out, pos):
    """``n`` bytes of ``data`` from ``src`` to ``out`` at ``pos``; returns the code points they hold (the bytes
    that do not continue a UTF-8 sequence)."""
    chars = 0
    for m in range(n):
        b = data[src + m]
        out[pos + m] = b
        if (b & 0xC0) != 0x80:
            chars += 1
    return chars


@njit(nogil=True, cache=True)
def _gather(data, status, start, length, items_first, items_count, item_start, item_len, out, char_start,
            char_end):
    """Each record's field into ``out``: a string as it is, a list as a token list (U+001E, then the items
    separated by U+001F, which no item here holds: control bytes fall back); ``char_start``/``char_end``: where each one is in
    ``out`` decoded (in code points), so the batch is decoded once and sliced."""
    pos = 0
    chars = 0
    for r in range(status.shape[0]):
        char_start[r] = chars
        st = status[r]
        if st == OK_STRING:
            chars += _copy(data, start[r], length[r], out, pos)
            pos += length[r]
        elif st == OK_LIST:
            out[pos] = 0x1E
            pos += 1
            chars += 1
            for k in range(items_first[r], items_first[r] + items_count[r]):
                if k > items_first[r]:
                    out[pos] = 0x1F
                    pos += 1
                    chars += 1
                chars += _copy(data, item_start[k], item_len[k], out, pos)
                pos += item_len[k]
        char_end[r] = chars
    return pos


_TRUE = np.frombuffer(b"true", dtype=np.uint8)
_FALSE = np.frombuffer(b"false", dtype=np.uint8)
_NULL = np.frombuffer(b"null", dtype=np.uint8)


def scan_records(values: list[bytes], path: tuple[str, ...]):
    """(status of each of ``values``, the fields decoded end to end, where each one starts and ends in
    it): for ``OK_STRING`` the string, for ``OK_LIST`` the items joined by U+001F, else nothing. The
    values must be UTF-8 (the stream checked them); see the module docstring."""
    data = b"".join(values)
    raw = np.frombuffer(data, dtype=np.uint8)
    ends = np.cumsum(np.fromiter(map(len, values), dtype=np.int64, count=len(values)))
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
    _scan(raw, ends, path_bytes, path_ends, status, start, length, items_first, items_count, item_start, item_len,
          _TRUE, _FALSE, _NULL)
    out = np.empty(len(data) + n, dtype=np.uint8)
    char_start = np.empty(n, dtype=np.int64)
    char_end = np.empty(n, dtype=np.int64)
    used = _gather(raw, status, start, length, items_first, items_count, item_start, item_len, out, char_start,
                   char_end)
    text = out[:used].tobytes().decode("utf-8")
    return status.tolist(), text, char_start.tolist(), char_end.tolist()
