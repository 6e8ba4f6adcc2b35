"""The slot mapping racesim computes where vLLM launches its Triton kernel (0.20+,
racesim.engine_vllm.runner.shims.cpu_slot_mapping): each scheduled token's KV slot is its row's
block at ``position // block_size`` times the block size plus ``position % block_size``, and the
buffer past the batch's tokens is -1 (the kernel's PAD_SLOT_ID). No run's trace reads it (the
forward pass is fake), so it is checked here, on both of its paths (a few tokens in Python,
more in numpy), against that formula written out token by token."""

from __future__ import annotations

import random
from types import SimpleNamespace as NS

import pytest

from racesim.engine_vllm.runner import shims

torch = pytest.importorskip("torch")

ROWS, WIDTH, BLOCK = 8, 16, 4


def _batch(rng: random.Random) -> tuple[list[int], list[int]]:
    """Tokens per row and their positions (each row's run of consecutive positions)."""
    counts = [rng.randint(0, 12) for _ in range(rng.randint(1, ROWS))]
    positions = []
    for c in counts:
        start = rng.randint(0, WIDTH * BLOCK - 13)
        positions += range(start, start + c)
    return counts, positions


@pytest.mark.parametrize("few", [0, 10**6], ids=["numpy", "python"])
def test_each_token_gets_its_block_s_slot_and_the_rest_is_padding(
        few: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shims, "FEW_TOKENS", few)
    rng = random.Random(7)
    for _ in range(200):
        table = torch.randint(0, 500, (ROWS, WIDTH), dtype=torch.int32)
        out = torch.full((150,), 7, dtype=torch.int64)
        block_table = NS(block_size=BLOCK, block_table=NS(gpu=table),
                         slot_mapping=NS(gpu=out))
        counts, positions = _batch(rng)
        starts = [0]
        for c in counts:
            starts.append(starts[-1] + c)
        want = []
        for row, c in enumerate(counts):
            for p in positions[starts[row]:starts[row] + c]:
                want.append(int(table[row, p // BLOCK]) * BLOCK + p % BLOCK)
        shims.cpu_slot_mapping(block_table)(len(counts),
                                            torch.tensor(starts, dtype=torch.int32),
                                            torch.tensor(positions, dtype=torch.int64))
        got = out.tolist()
        assert got[:len(want)] == want
        assert got[len(want):] == [-1] * (len(got) - len(want))


def test_a_new_table_tensor_is_read_not_the_first_one_s_view() -> None:
    """The numpy views are remade when BlockTable's buffer is another tensor object."""
    first = torch.zeros((ROWS, WIDTH), dtype=torch.int32)
    out = torch.zeros(8, dtype=torch.int64)
    block_table = NS(block_size=BLOCK, block_table=NS(gpu=first), slot_mapping=NS(gpu=out))
    compute = shims.cpu_slot_mapping(block_table)
    qsl, pos = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([5], dtype=torch.int64)
    compute(1, qsl, pos)
    assert out[0] == 0 * BLOCK + 1
    block_table.block_table.gpu = torch.full((ROWS, WIDTH), 3, dtype=torch.int32)
    compute(1, qsl, pos)
    assert out[0] == 3 * BLOCK + 1
