"""The cost tables' time matrices, compiled (see :mod:`optimizer.jit`).

:func:`fill_time_matrices` evaluates the per-sample cost formula of :mod:`optimizer.costs.profile` for
every sample and allowed group size, across nodes and within one, with the same floating-point
operations in the same order as :func:`optimizer.costs.tables.sample_time` (so the matrices agree
with it to the last bit). Divisions are written ``np.true_divide`` (every divisor here is positive)
and the kernel is compiled with numpy's error model (the padding's integer division, by at least 1,
gets no zero test): compiled code then tests nothing per element, which lets the compiler vectorise
the loop over group sizes (with the zero test it does not, and one such pass per matrix took about
three times as long as this one pass for both).

:func:`best_placement` is the rule that combines the intra- and inter-node matrices into the best
placement of each size (intra-node where the size fits a node); :func:`fill_best_time` applies it
to a whole table, :func:`fill_best_columns` to a few sizes, and the lower bound's loops apply it
on the fly.
"""

from __future__ import annotations

import numpy as np

from optimizer.jit import compiled


def _fill_time_matrices_arrays(
    lengths: np.ndarray,
    vision: np.ndarray,
    degrees: np.ndarray,
    share: np.ndarray,
    a2a_share: np.ndarray,
    bandwidth: np.ndarray,
    latency: np.ndarray,
    intra_bandwidth: np.ndarray,
    intra_latency: np.ndarray,
    quadratic: float,
    linear: float,
    sample_constant: float,
    bytes_per_token: float,
    a2a_bytes_per_token: float,
    speed: float,
    overlap: bool,
    sample_step: float,
    pad_unit: int,
    out: np.ndarray,
    intra_out: np.ndarray,
) -> None:
    """:func:`fill_time_matrices` with numpy's array operations: the same operations on each element in the
    same order, so the same bits (the form that runs before numba is loaded, :mod:`optimizer.jit`)."""
    if out.size == 0:
        return
    slow = speed != 1.0
    length = lengths.astype(np.float64)[:, None]
    d = degrees.astype(np.float64)[None, :]
    square = quadratic * length * length
    work = square + linear * length + vision.astype(np.float64)[:, None]
    compute = work / d
    if slow:
        compute = compute / speed
    compute = compute + sample_constant / speed
    single = compute
    step = sample_step * (d - 1.0)
    if slow:
        step = step / speed
    compute = compute + step
    if pad_unit > 0:
        unit = pad_unit * d.astype(np.int64)
        sent_length = (-(-lengths.astype(np.int64)[:, None] // unit) * unit).astype(np.float64)
        sent = bytes_per_token * sent_length
    else:
        sent_length = np.broadcast_to(length, out.shape)
        sent = np.broadcast_to(bytes_per_token * length, out.shape)
    attention = None
    if overlap:
        attention = square / d
        if slow:
            attention = attention / speed

    def fill(target: np.ndarray, bw: np.ndarray, lat: np.ndarray) -> None:
        comm = sent * share[None, :] / bw[None, :] + lat[None, :]
        if attention is not None:
            comm = np.maximum(comm - attention, 0.0)
        if a2a_bytes_per_token > 0.0:
            comm = comm + a2a_bytes_per_token * sent_length * a2a_share[None, :] / bw[None, :]
        target[:, :] = np.where(d == 1.0, single, compute + comm)

    fill(out, bandwidth, latency)
    fill(intra_out, intra_bandwidth, intra_latency)


@compiled(python=_fill_time_matrices_arrays, error_model="numpy")
def fill_time_matrices(
    lengths: np.ndarray,
    vision: np.ndarray,
    degrees: np.ndarray,
    share: np.ndarray,
    a2a_share: np.ndarray,
    bandwidth: np.ndarray,
    latency: np.ndarray,
    intra_bandwidth: np.ndarray,
    intra_latency: np.ndarray,
    quadratic: float,
    linear: float,
    sample_constant: float,
    bytes_per_token: float,
    a2a_bytes_per_token: float,
    speed: float,
    overlap: bool,
    sample_step: float,
    pad_unit: int,
    out: np.ndarray,
    intra_out: np.ndarray,
) -> None:
    """``out[i, j]``: seconds sample i adds to a group of ``degrees[j]`` ranks on the links
    ``bandwidth[j]`` / ``latency[j]``; ``intra_out[i, j]`` the same on ``intra_bandwidth[j]`` /
    ``intra_latency[j]``. One pass fills both: the compute terms are shared, the messages differ by link.

    Per size j: ``share[j]`` is the fraction of a sample's tokens each rank exchanges (at
    ``bytes_per_token``), ``a2a_share[j]`` the fraction it exchanges in a hybrid group's all-to-alls (at
    ``a2a_bytes_per_token``, never hidden behind attention; :mod:`optimizer.costs.cp_schemes`), the
    bandwidths are in bytes/s and the latencies are the messages' total. ``sample_step`` is the work a
    sample adds per extra rank; ``pad_unit`` > 0 sends the bytes of the sample padded to a multiple of
    ``pad_unit`` times the group size (0: its own length). Dividing by a ``speed`` of 1 changes no bit,
    so the loop does not test for it.
    """
    n = lengths.shape[0]
    n_degrees = degrees.shape[0]
    per_sample = np.true_divide(sample_constant, speed)
    for i in range(n):
        length = float(lengths[i])
        square = quadratic * length * length
        work = square + linear * length + vision[i]
        volume = bytes_per_token * length
        for j in range(n_degrees):
            d = degrees[j]
            single = np.true_divide(np.true_divide(work, d), speed) + per_sample
            full = single + np.true_divide(sample_step * (d - 1.0), speed)
            sent = volume
            sent_length = length
            if pad_unit > 0:
                unit = pad_unit * int(d)
                sent_length = float(-(-int(lengths[i]) // unit) * unit)
                sent = bytes_per_token * sent_length
            exchanged = sent * share[j]
            comm = np.true_divide(exchanged, bandwidth[j]) + latency[j]
            intra = np.true_divide(exchanged, intra_bandwidth[j]) + intra_latency[j]
            if overlap:
                attention = np.true_divide(np.true_divide(square, d), speed)
                comm = max(comm - attention, 0.0)
                intra = max(intra - attention, 0.0)
            if a2a_bytes_per_token > 0.0:
                a2a = a2a_bytes_per_token * sent_length * a2a_share[j]
                comm += np.true_divide(a2a, bandwidth[j])
                intra += np.true_divide(a2a, intra_bandwidth[j])
            one = d == 1.0
            out[i, j] = single if one else full + comm
            intra_out[i, j] = single if one else full + intra


@compiled
def best_placement(intra: float, inter: float, fits_node: bool) -> float:
    """A sample's time on the better placement of a size: the smaller of its ``intra`` and ``inter``
    node times where the size fits a node, else ``inter``."""
    if fits_node and intra < inter:
        return intra
    return inter


@compiled
def fill_best_time(intra: np.ndarray, inter: np.ndarray, fits_node: np.ndarray, out: np.ndarray) -> None:
    """``out[i, j]``: :func:`best_placement` of every sample and size."""
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = best_placement(intra[i, j], inter[i, j], fits_node[j])


@compiled
def fill_best_columns(
    intra: np.ndarray, inter: np.ndarray, fits_node: np.ndarray, columns: np.ndarray, out: np.ndarray
) -> None:
    """``out[k, i]``: :func:`best_placement` of sample i and size ``columns[k]`` (one pass over the rows)."""
    for i in range(intra.shape[0]):
        for k in range(columns.shape[0]):
            j = columns[k]
            out[k, i] = best_placement(intra[i, j], inter[i, j], fits_node[j])


def _gather_columns_arrays(matrix: np.ndarray, columns: np.ndarray, out: np.ndarray) -> None:
    """:func:`gather_columns` with numpy's indexing (the form before numba is loaded)."""
    out[:, :] = matrix[:, columns]


@compiled(python=_gather_columns_arrays)
def gather_columns(matrix: np.ndarray, columns: np.ndarray, out: np.ndarray) -> None:
    """``out[i, k] = matrix[i, columns[k]]``, row by row: one pass over the matrix, the output's rows
    written whole (numpy's ``matrix[:, columns]`` lays its result out by column)."""
    for i in range(matrix.shape[0]):
        for k in range(columns.shape[0]):
            out[i, k] = matrix[i, columns[k]]
