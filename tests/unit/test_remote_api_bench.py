"""bench/ helpers of issue 14: the DeepBench training set as DeepBench's gemm_problems.h lists it
(count, distinctness, entries spot-checked against the header), and the median used for every
ratio."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))

import deepbench
from _stats import median_of


def test_training_set_has_deepbench_160_problems():
    s = deepbench.training_set()
    assert len(s) == 160 and len(set(s)) == 160
    # entries copied from baidu-research/DeepBench code/kernels/gemm_problems.h, training_set
    for p in [(1760, 16, 1760, False, False), (4096, 7000, 4096, True, False), (2560, 7133, 2560, False, True),
              (35, 8457, 4096, True, False), (7680, 128, 2560, True, False), (3072, 7435, 1024, False, True),
              (7680, 5481, 2560, False, True), (1024, 16, 500000, True, False), (1024, 700, 512, True, False),
              (8448, 48000, 2816, True, False), (4608, 32, 1536, True, False), (1024, 24000, 1536, True, False),
              (512, 16, 512, False, True), (1024, 32, 512, False, True), (512, 48000, 2816, False, False)]:
        assert p in s, p
    assert sum(1 for p in s if p[3]) == 73 and sum(1 for p in s if p[4]) == 10
    assert {p[:3] for p in deepbench.SAMPLE} <= {p[:3] for p in s}


def test_median_of():
    assert median_of([3.0, 1.0, 2.0]) == 2.0
    assert median_of([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert median_of([]) != median_of([])  # NaN
