"""The test worker's `dense` model, for checking answers: the scripts beside
this one import it (their directory is on sys.path when run)."""

import numpy as np


def expected(x: np.ndarray) -> np.ndarray:
    # W[i][j] = ((i*4 + j) * 37 mod 29) / 14 - 1 ; b[j] = (j - 1.5) / 10
    i = np.arange(16)[:, None]
    j = np.arange(4)[None, :]
    w = (((i * 4 + j) * 37) % 29).astype(np.float32) / np.float32(14) - np.float32(1)
    b = (np.arange(4, dtype=np.float32) - np.float32(1.5)) / np.float32(10)
    return np.tanh(x @ w / np.float32(4) + b)
