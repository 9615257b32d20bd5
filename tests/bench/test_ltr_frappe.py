"""bench.ltr's Frappe lists: one list per (user, context), whole lists on either side of each split."""

import numpy as np
import pyarrow as pa
import pytest

from bench.lib.ltr_frappe import CONTEXT, frappe_protocol, list_ids


def test_a_list_is_one_user_in_one_context():
    ctx = {c: [0, 0, 0, 0] for c in CONTEXT}
    ctx["user"] = [1, 1, 2, 1]
    ctx["city"] = [5, 5, 5, 6]  # row 3: the same user in another city, another list
    lst = list_ids(pa.table({**ctx, "item": [10, 11, 10, 12]}))
    assert lst[0] == lst[1] and len({lst[0], lst[2], lst[3]}) == 3


@pytest.mark.slow  # reads and encodes the whole log (~15 s)
def test_the_splits_keep_whole_lists():
    p = frappe_protocol(0)
    assert p.name == "frappe" and p.cutoff == 10
    train, held, fit, val = (set(np.unique(x.groups).tolist()) for x in (p.train, p.held, p.fit, p.val))
    assert not train & held and not fit & val and fit | val == train
    assert p.train.n + p.held.n == 86_582 and p.fit.n + p.val.n == p.train.n
    assert 0.15 < len(held) / (len(train) + len(held)) < 0.25  # 20% of the lists
    assert set(np.unique(p.train.labels).tolist()) == {0.0, 1.0}
