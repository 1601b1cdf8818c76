# --------------------------------------------------------------------------
# Row-wise reversal of valid prefixes (the reverse direction of bidirectional
# layers; tf.reverse_sequence with seq_axis=0, batch_axis=1)
# --------------------------------------------------------------------------

def reverse_prefixes(const unsigned char[:, :, ::1] src, const int64_t[::1] lengths,
                     unsigned char[:, :, ::1] dst):
    """dst[t, b] = src[n_b - 1 - t, b] for t < n_b = lengths[b], and src[t, b]
    for t >= n_b: a permutation of the steps of each row, its own inverse.

    src and dst (T, B, row_bytes) are the bytes of two distinct C-contiguous
    arrays (T, B, ...) of any dtype; lengths (B,) int64 in [0, T], validated by
    the caller (blockrnn/sequence.py). One memcpy per (t, b) row, serial: the
    copy is bound by memory bandwidth, not by a core."""
    cdef Py_ssize_t T = src.shape[0], B = src.shape[1], row = src.shape[2]
    cdef Py_ssize_t t, b, n, s
    if T == 0 or B == 0 or row == 0:
        return
    with nogil:
        for t in range(T):
            for b in range(B):
                n = lengths[b]
                s = n - 1 - t if t < n else t
                memcpy(&dst[t, b, 0], &src[s, b, 0], row)



def reverse_prefixes_in_place(unsigned char[:, :, ::1] a, const int64_t[::1] lengths):
    """a[t, b] <-> a[n_b - 1 - t, b] for t < n_b // 2, n_b = lengths[b]: the
    permutation of reverse_prefixes applied to a itself, by swapping rows (no
    second array). a (T, B, row_bytes): the bytes of a C-contiguous array;
    lengths (B,) int64 in [0, T], validated by the caller
    (blockrnn/sequence.py). Steps outer, rows inner: the swaps walk a's
    memory in order from both ends."""
    cdef Py_ssize_t T = a.shape[0], B = a.shape[1], row = a.shape[2]
    cdef Py_ssize_t t, b, n, k, m
    cdef unsigned char* p
    cdef unsigned char* q
    cdef unsigned char buf[256]
    if T == 0 or B == 0 or row == 0:
        return
    with nogil:
        for t in range(T // 2):
            for b in range(B):
                n = lengths[b]
                if t >= n // 2:
                    continue
                p = &a[t, b, 0]
                q = &a[n - 1 - t, b, 0]
                k = 0
                while k < row:
                    m = min(row - k, <Py_ssize_t>256)
                    memcpy(buf, p + k, m)
                    memcpy(p + k, q + k, m)
                    memcpy(q + k, buf, m)
                    k += m
