"""`bench.ltr`'s lists: MovieLens-100K ratings as graded relevance under two protocols, and a generated data set
whose lists differ by a list-level click propensity.

Every protocol gives a ``Protocol``: the encoded training and held-out rows (``offgraph.model.inputs.Encoded``,
their ``groups`` the lists), the training rows again as fit + validation rows (the validation rows carved from
the TRAINING period only, as the held-out rows are from the whole: each user's latest ``VALIDATION`` of their
training ratings; the generated set's latest training lists), and per row the item id, for the non-learned
orders (an item's prior mean grade and its popularity, both from the training rows only).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import yaml

from offgraph.data import movielens
from offgraph.features.spec import FeatureSpec, parse_spec
from offgraph.model.inputs import Encoded, encode_table
from offgraph.model.splits import held_out_mask

REPO = Path(__file__).resolve().parents[2]
MOVIELENS_SPEC = REPO / "examples" / "movielens.yaml"
HELD_OUT = 0.2  # each user's latest 20% of ratings (per-key-time, as the demo's run)
# of the training ratings, each user's latest 20% (per-key-time again) pick the epochs and settings: the
# held-out lists are never looked at before the final scoring
VALIDATION = 0.2


@dataclass
class Protocol:
    name: str
    cutoff: int  # the NDCG@k the protocol's acceptance line reads
    spec: FeatureSpec
    train: Encoded
    held: Encoded
    train_items: np.ndarray
    held_items: np.ndarray
    fit: Encoded  # the training rows less the validation ones
    val: Encoded  # validation rows, from the training period only
    fit_items: np.ndarray
    val_items: np.ndarray


def with_model(spec: FeatureSpec, **model: object) -> FeatureSpec:
    """``spec`` with these ``model:`` keys set (learning settings: l2_embedding, l2_dense, dropout, embedding_dim;
    none changes the encoding, so a protocol's encoded rows serve every setting)."""
    raw = spec.to_dict()
    raw["model"] = {**raw.get("model", {}), **model}
    return parse_spec(raw)


def movielens_spec() -> FeatureSpec:
    """examples/movielens.yaml with the label the grade (rating - 1: 0..4, gain 2^(rating-1) - 1)."""
    raw = yaml.safe_load(MOVIELENS_SPEC.read_text())
    raw["label"] = "grade"
    return parse_spec(raw)


def movielens_protocols(lists_per_user: int, held_lists_per_user: int, list_size: int, seed: int) -> list[Protocol]:
    """(user-day lists, the tutorials' sampled lists) on one encoding of MovieLens-100K: the held-out ratings are
    each user's latest 20% (per-key-time, by timestamp); a user-day list is the ratings of one user on one
    UTC day (``request_id``); a sampled list is ``list_size`` ratings drawn without replacement from one user's
    training (``lists_per_user`` lists) or held-out ratings (``held_lists_per_user``), as TensorFlow Ranking's
    MovieLens tutorial samples them (its ``num_list_per_user``, ``list_size`` 5)."""
    table = movielens.load(fetch=False)
    table = table.append_column("grade", pa.array(table.column("rating").to_numpy() - 1))
    spec = movielens_spec()
    data = encode_table(spec, table, "movielens-100k")
    items = table.column("movie_id").to_numpy()
    users = table.column("user_id").to_numpy()
    held = held_out_mask("per-key-time", data.n, HELD_OUT, seed, time=data.time, key=data.key)
    tr, te = np.flatnonzero(~held), np.flatnonzero(held)
    train = data.take(tr)
    val = held_out_mask("per-key-time", train.n, VALIDATION, seed, time=train.time, key=train.key)
    fi, va = tr[~val], tr[val]
    day = Protocol(
        "user-day",
        10,
        spec,
        train,
        data.take(te),
        items[tr],
        items[te],
        data.take(fi),
        data.take(va),
        items[fi],
        items[va],
    )
    rng = np.random.default_rng(seed)
    tr_rows, tr_lists = sample_lists(users[tr], lists_per_user, list_size, rng)
    te_rows, te_lists = sample_lists(users[te], held_lists_per_user, list_size, rng)
    # drawn after the training and held-out lists, so those are the same lists with or without validation
    fi_rows, fi_lists = sample_lists(users[fi], lists_per_user, list_size, rng)
    va_rows, va_lists = sample_lists(users[va], held_lists_per_user, list_size, rng)
    sampled = Protocol(
        f"sampled-{list_size}",
        list_size,
        spec,
        replace(data.take(tr[tr_rows]), groups=tr_lists),
        replace(data.take(te[te_rows]), groups=te_lists),
        items[tr[tr_rows]],
        items[te[te_rows]],
        replace(data.take(fi[fi_rows]), groups=fi_lists),
        replace(data.take(va[va_rows]), groups=va_lists),
        items[fi[fi_rows]],
        items[va[va_rows]],
    )
    return [day, sampled]


def sample_lists(
    users: np.ndarray, per_user: int, size: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(row indices, list ids): ``per_user`` lists of ``size`` distinct rows of each user with at least ``size``
    rows. One random key per (list, row): the ``size`` smallest keys among a user's rows make the list."""
    _, uid = np.unique(users, return_inverse=True)
    by_user = np.argsort(uid, kind="stable")
    counts = np.bincount(uid)
    starts = np.cumsum(counts) - counts
    ok = np.flatnonzero(counts >= size)
    rows, lists = [], []
    for j in range(per_user):  # per list draw (a handful), columnar over users and rows
        key = rng.random(len(users))
        order = np.lexsort((key[by_user], uid[by_user]))  # each user's rows in a random order
        ranked = by_user[order]
        pick = (starts[ok][:, None] + np.arange(size)[None, :]).ravel()
        rows.append(ranked[pick])
        lists.append(np.repeat(ok * per_user + j, size))
    return np.concatenate(rows), np.concatenate(lists)


def generated_spec() -> FeatureSpec:
    return parse_spec(
        {
            "label": "y",
            "group": "list",
            "time": "t",
            "model": {"embedding_dim": 8, "mlp": [32, 16]},
            "fields": [
                {"name": "ctx", "scope": "request", "op": "id", "input": "ctx", "rows": 1009},
                {"name": "item", "scope": "item", "op": "id", "input": "item", "rows": 20011},
            ],
        }
    )


def generated_protocol(
    seed: int, n_lists: int = 4000, size: int = 10, n_items: int = 200, held_lists: int | None = None
) -> Protocol:
    """Lists of ``size`` items of ``n_items``. An item has a quality q ~ N(0, 1) and a promotion p ~ N(0, 1),
    independent; a list has an offset o ~ N(0, 2), a click propensity of the whole list (exposure, position)
    that says nothing about the order within it. A click: Bernoulli(sigmoid(q + o)), so within a list the order
    is the items' quality alone. Which items a list shows follows its offset (probability ∝ exp(o * p): a
    high-propensity list shows promoted items), as exposure does in a real log, so an item's clicks across lists
    mix its quality with the offsets of the lists it was shown in. The held-out rows are the last 20% of lists
    (the spec's time is the list's number: the 'time' split), the validation rows the last 20% of the training
    lists. ``ctx``: a list-level id, list mod 997, that carries nothing. ``held_lists``: instead, the ``n_lists`` lists
    are the training ones and that many more after them are held out (the same training data size, a held-out set
    as large as the paired intervals need)."""
    rng = np.random.default_rng(1000 + seed)
    train_lists = n_lists
    if held_lists is not None:
        n_lists += held_lists
    quality, promo = rng.normal(0, 1, n_items), rng.normal(0, 1, n_items)
    offset = rng.normal(0, 2, n_lists)
    # exposure: Gumbel top-k over log-weights o * p draws `size` distinct items per list, ∝ exp(o * p)
    logits = offset[:, None] * promo[None, :] + rng.gumbel(size=(n_lists, n_items))
    item = np.argsort(-logits, axis=1)[:, :size].ravel()
    lst = np.repeat(np.arange(n_lists), size)
    p = 1.0 / (1.0 + np.exp(-(quality[item] + offset[lst])))
    y = (rng.random(len(lst)) < p).astype(np.int64)
    table = pa.table({"y": y, "list": lst, "t": lst.astype(np.float64), "ctx": lst % 997, "item": item})
    spec = generated_spec()
    data = encode_table(spec, table, "generated")
    if held_lists is None:
        held = held_out_mask("time", data.n, HELD_OUT, seed, time=data.time)
    else:
        held = np.asarray(data.time) >= train_lists
    tr, te = np.flatnonzero(~held), np.flatnonzero(held)
    val = held_out_mask("time", len(tr), VALIDATION, seed, time=data.time[tr])
    fi, va = tr[~val], tr[val]
    return Protocol(
        "generated",
        10,
        spec,
        data.take(tr),
        data.take(te),
        item[tr],
        item[te],
        data.take(fi),
        data.take(va),
        item[fi],
        item[va],
    )
