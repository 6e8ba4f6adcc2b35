"""Trace hashes pinned across racesim versions: a counterexample file written by an earlier
racesim replays to the same hash (DESIGN "Determinism rules").

Every other determinism test compares runs with each other; this one compares them with hashes
recorded before the compiled build and the hot-path work of issue 7, so a change that only
means to be faster cannot change a trace unnoticed. A change that *means* to change the model
(or the trace format) updates this table in the same commit and says why.
"""

from __future__ import annotations

import pytest

from racesim.runner import run_scenario
from scenarios import load_scenario

#: (scenario, policy, witness) -> trace hash, recorded at commit 2bdddef (racesim 0.1.0).
GOLDEN = {
    ("abort-reuse", "buggy", False):
        "bd5e7e80489f8203728157dd31b949ff65ac42b9476f54bfc59b3ed91ceb8005",
    ("abort-reuse", "buggy", True):
        "4e42d93ecb7838f9367b27b60ffd7fed0c14266a51cf62c072d3e36f4b1ab6ac",
    ("abort-reuse", "internal-id", False):
        "99ca420c6a9f0a7218c188282a6c9b6d244f3ae93d56df015b05c68aafa0c491",
    ("abort-reuse", "internal-id", True):
        "d8b75887821db2dcb192ad987c592819700576e55bc03f7edc98669d78d8117c",
    ("abort-storm", "buggy", False):
        "db080f96305149aa21987add22d5ccf556909cf0d7fdb263f69771f2e2c6dee3",
    ("abort-storm", "buggy", True):
        "7a7fcbe68025a782fec7c813de77243f8a9daf0b4a228a73c2bcb2ae4813c4e2",
    ("abort-storm", "internal-id", False):
        "adc3505097fa135c7db3bcafc71acc5acf158fa8f92fd8aecb870203c7fb2a3d",
    ("abort-storm", "internal-id", True):
        "62cf51b0c788383712e859e950ea2a46d9fc5035ab95773ed652e92c868df7f2",
    ("async-sched-reuse", "buggy", False):
        "bffb5be7f5384b47390fa0db28ec8fdb61e0a732105d1ea19d227818b517d862",
    ("async-sched-reuse", "buggy", True):
        "74283706cb260a1e26743c8f8806b18a6a1e15e3562c42c148e2a9850236f3d1",
    ("async-sched-reuse", "internal-id", False):
        "016e4116cea3bba7ca6bb9feb7fc8b1e1f5509d77298f81851ffdf741c2fdb23",
    ("async-sched-reuse", "internal-id", True):
        "e269cc290bc357d6edbaaf134dc64721867e7dd46b5d0d3c7c9f995eb964f7cb",
    ("multi-frontend", "buggy", False):
        "e1d88c15990c5332c4dc1247d0de3a09e06c6d48ef105f6e1eadf8dc2f251b73",
    ("multi-frontend", "buggy", True):
        "e1d88c15990c5332c4dc1247d0de3a09e06c6d48ef105f6e1eadf8dc2f251b73",
    ("multi-frontend", "internal-id", False):
        "4b85e37cb1421cd10707bc0699457105c9b665e8dbaf25c2624d51c742bd98e2",
    ("multi-frontend", "internal-id", True):
        "4b85e37cb1421cd10707bc0699457105c9b665e8dbaf25c2624d51c742bd98e2",
    ("parallel-sampling-abort", "buggy", False):
        "88267327db52f98397880ecb60fddc7ecaf2a56d12ea45a29e302aa7ad8d90d7",
    ("parallel-sampling-abort", "buggy", True):
        "59209edc355160e0bf0e29fd384aa6bdd911e9d90c4a511ec0046e53d5f9f4a7",
    ("parallel-sampling-abort", "internal-id", False):
        "efc1742feb954a23f363fc27d328864827cd271fc4700f6e91193371dc94ee0a",
    ("parallel-sampling-abort", "internal-id", True):
        "d9526e69fd21efbaa5614c13f64a5e41ff97da92b25acb0f49c562917ad379a3",
    ("pd-reuse", "buggy", False):
        "754009e777adc895bc66a42b476a293ffb71ce926d8aa725c4434db3bb198d0c",
    ("pd-reuse", "buggy", True):
        "c5cb7d19df3dd8b9adbe20f9d1c54160b60948b895b6592044941011141c59e2",
    ("pd-reuse", "internal-id", False):
        "af7d297184413fc5fcb21d71219805d574dbc9c2ef795b8ff98858acad8b22db",
    ("pd-reuse", "internal-id", True):
        "e8c553cd3ebbf7887a61e3bbd6673ae4631168542b27fdd780b961850bf90df4",
    ("stale-abort-reuse", "buggy", False):
        "2242af0eafefebe1667e1867190bad2fd69e00df0212c6f04418be45a945f7f0",
    ("stale-abort-reuse", "buggy", True):
        "7b81173acd823c2aa484b23732a447f40cbde57ce51fde7e7e2c6e9bf190005a",
    ("stale-abort-reuse", "internal-id", False):
        "9def9568bf00c66e02d56f1359dc64c2f6d6df2713cc17599fcc74d27b148d0e",
    ("stale-abort-reuse", "internal-id", True):
        "0b2d97842e7ce554d1ee065f81aabffa6ff4bbbdb811039095e129c85937c64f",
    ("stop-string-reuse", "buggy", False):
        "7bfd0f5200a8c319e764ea8fcae9fc4859911d2a75d4527d923fde9a30cd0c9c",
    ("stop-string-reuse", "buggy", True):
        "69bcf61ae97c49edcec072e2419ef311753649e48afdb3595f1c32f10738609b",
    ("stop-string-reuse", "internal-id", False):
        "b68765a8f6f04a5fa55298e663a0dd16dbad6148b9f89b4a2c106dd9788c8e54",
    ("stop-string-reuse", "internal-id", True):
        "64f3ffee45a11759fc7508fb536059eaeac943082cf7ab6ca80e07449067139b",
}


@pytest.mark.parametrize("key", sorted(GOLDEN), ids=lambda k: "-".join(map(str, k)))
def test_trace_hash_matches_the_recorded_one(key: tuple[str, str, bool]) -> None:
    name, policy, witness = key
    assert run_scenario(load_scenario(name), policy, witness=witness).trace_hash == GOLDEN[key]
