# Included by _kernels.pyx: the packed product and its threads.
# The packed-weight kernel of include/brnn_packed.h (variant chosen once at
# import), the thread budget every parallel region draws from, and the rules
# that split a product's panels between threads (unit_start) so that no
# thread count changes a bit.

cdef extern from "brnn_packed.h" nogil:
    ctypedef void (*brnn_packed_fn)(Py_ssize_t rows, Py_ssize_t K, const float* A,
                                    Py_ssize_t lda, const float* P, Py_ssize_t n0,
                                    Py_ssize_t n1, int accumulate, float* C, Py_ssize_t ldc)
    enum:
        BRNN_NR
        BRNN_PACKED_PORTABLE
        BRNN_PACKED_AVX2
        BRNN_PACKED_AVX512
    Py_ssize_t brnn_packed_size(Py_ssize_t K, Py_ssize_t N)
    void brnn_pack_f32(Py_ssize_t K, Py_ssize_t N, const float* w, Py_ssize_t sk,
                       Py_ssize_t sn, float* P)
    int brnn_packed_path_supported(int path)
    int brnn_packed_best_path()
    brnn_packed_fn brnn_packed_kernel(int path)
    int brnn_budget_take(int want, int total)
    void brnn_budget_give(int n)
    int brnn_budget_in_use()
    int brnn_budget_overcommitted(int cores)
    ctypedef struct brnn_barrier:
        int count
        int gen
        int shed
        int slow
        long long waited_ns
    long long BRNN_SHED_WAIT_NS
    void brnn_barrier_wait(brnn_barrier* b, int n)
    void brnn_barrier_wait_within(brnn_barrier* b, int n, brnn_barrier* step)
    int brnn_barrier_wait_shed(brnn_barrier* b, int n, int cores, int patient)
    int brnn_patient_sheds(long long waited_ns, long long elapsed_ns)
    int brnn_current_cpu()
    ctypedef struct brnn_solo:
        long long until
        long long spell
    int brnn_solo_now(const brnn_solo* s)
    void brnn_solo_start(brnn_solo* s)
    void brnn_solo_start_at(brnn_solo* s, long long now)
    int brnn_idle_for(const long long* last, long long idle_ns)
    void brnn_mark_now(long long* last)
    long long brnn_now_ns()
    ctypedef struct brnn_pace:
        long long fs_per_mac[2]
        long long streak
        long long retry_at
        int calls
        int after_one
    enum:
        BRNN_PACE_MANY
        BRNN_PACE_TIMED
    int brnn_pace_plan(brnn_pace* p, long long now)
    void brnn_pace_idle(brnn_pace* p)
    void brnn_pace_record(brnn_pace* p, int many, long long ns, long long macs)
    int brnn_atomic_load(const int* p)
    void brnn_atomic_add(int* p, int v)

cdef extern from "brnn_gemm.h" nogil:
    enum:
        BRNN_GEMM_KC
        BRNN_DGEMM_KC
        BRNN_GEMM_WS
    Py_ssize_t brnn_gemm_ws(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K)
    ctypedef struct brnn_gemm_job:
        Py_ssize_t M, N, K
        const float* a
        Py_ssize_t sam, sak
        const float* b
        Py_ssize_t sbk, sbn
        int accumulate
        float* c
        Py_ssize_t ldc
        const float* bp
    Py_ssize_t brnn_gemm_prepacked_size(Py_ssize_t K, Py_ssize_t N)
    void brnn_gemm_prepack_b(Py_ssize_t K, Py_ssize_t N, const float* b, Py_ssize_t sbk,
                             Py_ssize_t sbn, float* P)
    brnn_packed_fn brnn_gemm_kernel(int path)
    Py_ssize_t brnn_gemm_jobs_ws(int njobs, const brnn_gemm_job* jobs)
    void brnn_gemm_f32(brnn_packed_fn fn, const brnn_gemm_job* j, int tid, int nt, float* ws)
    void brnn_gemm_jobs_f32(brnn_packed_fn fn, int njobs, const brnn_gemm_job* jobs, int tid,
                            int nt, float* ws)
    # float64: the same driver over double micro-kernels
    enum:
        BRNN_DGEMM_WS
    ctypedef void (*brnn_dgemm_fn)(Py_ssize_t rows, Py_ssize_t K, const double* A,
                                   Py_ssize_t lda, const double* P, Py_ssize_t n0,
                                   Py_ssize_t n1, int accumulate, double* C, Py_ssize_t ldc)
    ctypedef struct brnn_dgemm_job:
        Py_ssize_t M, N, K
        const double* a
        Py_ssize_t sam, sak
        const double* b
        Py_ssize_t sbk, sbn
        int accumulate
        double* c
        Py_ssize_t ldc
    Py_ssize_t brnn_dgemm_ws(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K)
    brnn_dgemm_fn brnn_dgemm_kernel(int path)
    void brnn_pack_f64(Py_ssize_t K, Py_ssize_t N, const double* w, Py_ssize_t sk,
                       Py_ssize_t sn, double* P)
    Py_ssize_t brnn_dgemm_jobs_ws(int njobs, const brnn_dgemm_job* jobs)
    void brnn_gemm_f64(brnn_dgemm_fn fn, const brnn_dgemm_job* j, int tid, int nt, double* ws)
    void brnn_gemm_jobs_f64(brnn_dgemm_fn fn, int njobs, const brnn_dgemm_job* jobs, int tid,
                            int nt, double* ws)


PACKED_PATHS = {"portable": BRNN_PACKED_PORTABLE, "avx2": BRNN_PACKED_AVX2,
                "avx512": BRNN_PACKED_AVX512}


def packed_paths_supported():
    """Names of the packed-kernel variants this CPU can run, fastest first."""
    return [name for name in ("avx512", "avx2", "portable")
            if brnn_packed_path_supported(PACKED_PATHS[name])]


cdef int choose_packed_path() except -1:
    """BLOCKRNN_KERNEL = auto (default) | avx512 | avx2 | portable. Forcing a
    variant this CPU lacks is refused here (it would die of SIGILL)."""
    import os
    name = os.environ.get("BLOCKRNN_KERNEL", "auto").strip().lower() or "auto"
    if name == "auto":
        return brnn_packed_best_path()
    if name not in PACKED_PATHS:
        raise ValueError(f"BLOCKRNN_KERNEL must be one of auto, avx512, avx2, portable; "
                         f"got {name!r}")
    if not brnn_packed_path_supported(PACKED_PATHS[name]):
        raise RuntimeError(f"BLOCKRNN_KERNEL={name}, but this CPU cannot run it (it can "
                           f"run: {', '.join(packed_paths_supported())}); unset it or "
                           f"choose one of those")
    return PACKED_PATHS[name]


# Set once at import, read-only afterwards (like an ifunc resolution).
cdef int packed_path = choose_packed_path()
# Every float32 product, the per-step ones and the GEMM driver's, runs
# brnn_gemm_kernel: on AVX-512 its 12 x 32 tiles over panel pairs (two FMAs per
# broadcast; the 12 x 16 tile is load-bound), and for products of at most 6 rows
# 6 x 64 tiles over groups of four panels (enough FMA chains in flight);
# elsewhere the variant itself. Same bits as the 12 x 16 tile.
cdef brnn_packed_fn packed_product = brnn_gemm_kernel(packed_path)
cdef brnn_dgemm_fn dgemm_product = brnn_dgemm_kernel(packed_path)  # the float64 driver's


cdef extern from "brnn_inference.h" nogil:
    ctypedef void (*brnn_row1_fn)(Py_ssize_t K, const float* a, const float* P, Py_ssize_t n0,
                                  Py_ssize_t n1, int accumulate, float* c)
    brnn_row1_fn brnn_row1_kernel(int path)
    ctypedef void (*brnn_row1_wide_fn)(Py_ssize_t K, const float* a, const float* P,
                                       Py_ssize_t N, Py_ssize_t n0, Py_ssize_t n1,
                                       int accumulate, float* c)
    brnn_row1_wide_fn brnn_row1_wide_kernel(int path)
    void brnn_pack_wide_cols_f32(Py_ssize_t K, Py_ssize_t N, const float* w, Py_ssize_t sk,
                                 Py_ssize_t sn, Py_ssize_t c0, Py_ssize_t c1, float* P)
    void brnn_pack_wide_f32(Py_ssize_t K, Py_ssize_t N, const float* w, Py_ssize_t sk,
                            Py_ssize_t sn, float* P)
    ctypedef void (*brnn_row1_gates_fn)(Py_ssize_t K, const float* a, const float* Pp, int nq,
                                        float* out)
    brnn_row1_gates_fn brnn_row1_gates_kernel(int path)
    void brnn_pack_gates_f32(Py_ssize_t K, Py_ssize_t H, int nq, const float* w, Py_ssize_t sk,
                             Py_ssize_t sn, float* P)


# The one-row kernel of this process's packed variant (NULL: portable), fixed at import.
cdef brnn_row1_fn row1_product = brnn_row1_kernel(packed_path)
# Its wide-layout twin (NULL: portable); where it exists, batch 1 reads W_h in
# the wide layout (brnn_inference.h), else as panels through step_product.
cdef brnn_row1_wide_fn row1_wide_product = brnn_row1_wide_kernel(packed_path)
cdef bint row1_wide = row1_wide_product != NULL
# The fused batch-1 step's kernel (NULL: portable), on the gate-interleaved
# layout (brnn_inference.h): the LSTM and reset-after GRU inference forwards at
# batch 1.
cdef brnn_row1_gates_fn row1_gates_product = brnn_row1_gates_kernel(packed_path)


cdef enum:
    # Floats a workspace reserves so that its packed weights can start on a
    # 64-byte boundary (align64).
    PACKED_ALIGN_PAD = 16


cdef inline float* align64(float* p) noexcept nogil:
    """p rounded up to a 64-byte boundary (at most PACKED_ALIGN_PAD floats on).
    The one-row kernel loads a 64-byte panel row per FMA: packed weights 16
    bytes off a line split every load in two (measured, T=64 batch-1 steps
    on one core: 0.23 vs 0.15 ms at H=128, 0.87 vs 0.56 ms at H=256)."""
    return <float*>((<size_t>p + 63) & ~(<size_t>63))


cdef inline void step_product(Py_ssize_t rows, Py_ssize_t K, const float* A, Py_ssize_t lda,
                              const float* P, Py_ssize_t n0, Py_ssize_t n1, bint accumulate,
                              float* C, Py_ssize_t ldc) noexcept nogil:
    """packed_product, with one row by brnn_row1_kernel's 8 independent chains
    (the same sums, the same bits): the per-step products of the inference
    forwards and of the batch-1 training forwards."""
    if rows == 1 and row1_product != NULL:
        row1_product(K, A, P, n0, n1, accumulate, C)
    else:
        packed_product(rows, K, A, lda, P, n0, n1, accumulate, C, ldc)


cdef inline void pack_cols(Py_ssize_t K, Py_ssize_t N, const float* w, Py_ssize_t sk,
                           Py_ssize_t sn, bint wide, Py_ssize_t n0, Py_ssize_t n1,
                           float* P) noexcept nogil:
    """The columns [n0, n1) of pack_recurrent's copy P of W [K, N] (n0 a
    multiple of 16, n1 too or N): what the thread owning cells [n0, n1)
    reads, packed by that thread in the region (unit_start's split)."""
    if n1 <= n0:
        return
    if wide:
        brnn_pack_wide_cols_f32(K, N, w, sk, sn, n0, n1, P)
    else:
        brnn_pack_f32(K, n1 - n0, w + n0 * sn, sk, sn, P + n0 * K)


cdef inline void pack_recurrent(Py_ssize_t K, Py_ssize_t N, const float* w, Py_ssize_t sk,
                                Py_ssize_t sn, bint wide, float* P) noexcept nogil:
    """Pack a recurrent weight block W [K, N] (W(k, n) = w[k*sk + n*sn]) for
    recurrent_product: in the wide layout if `wide`, else as panels (every
    column: pack_cols over [0, N))."""
    pack_cols(K, N, w, sk, sn, wide, 0, N, P)


cdef inline void recurrent_product_ld(Py_ssize_t rows, Py_ssize_t K, const float* A,
                                      Py_ssize_t lda, const float* P, bint wide, Py_ssize_t N,
                                      Py_ssize_t n0, Py_ssize_t n1, bint accumulate, float* C,
                                      Py_ssize_t ldc) noexcept nogil:
    """A step's product with a recurrent weight block W [K, N] packed by
    pack_recurrent (wide: one row, the wide kernel; else step_product on
    panels), A [rows, K] of row stride lda. Same sums, same bits either way."""
    if wide:
        row1_wide_product(K, A, P, N, n0, n1, accumulate, C)
    else:
        step_product(rows, K, A, lda, P, n0, n1, accumulate, C, ldc)


cdef inline void recurrent_product(Py_ssize_t rows, Py_ssize_t K, const float* A,
                                   const float* P, bint wide, Py_ssize_t N, Py_ssize_t n0,
                                   Py_ssize_t n1, bint accumulate, float* C,
                                   Py_ssize_t ldc) noexcept nogil:
    """recurrent_product_ld with A's rows contiguous (lda = K)."""
    recurrent_product_ld(rows, K, A, K, P, wide, N, n0, n1, accumulate, C, ldc)


def row1_wide_memview(const float[::1] a, const float[:, :] w, bint accumulate,
                      float[::1] c, str path=None, Py_ssize_t n0=0, Py_ssize_t n1=-1):
    """c[n0:n1] (+)= a @ W[:, n0:n1] through the wide one-row kernel (for its
    tests): W [K, N] (any strides) packed in the wide layout, then one call of
    variant `path` (avx512 or avx2; this process's by default)."""
    cdef Py_ssize_t K = a.shape[0], N = w.shape[1]
    cdef int p = packed_path if path is None else PACKED_PATHS.get(path, -1)
    cdef brnn_row1_wide_fn fn = brnn_row1_wide_kernel(p) if p >= 0 else NULL
    if p < 0 or not brnn_packed_path_supported(p) or fn == NULL:
        raise ValueError(f"row1_wide_memview: path {path!r} has no wide kernel here")
    if n1 < 0:
        n1 = N
    if w.shape[0] != K or c.shape[0] != N or not 0 <= n0 <= n1 <= N or n0 % BRNN_NR:
        raise ValueError("row1_wide_memview: inconsistent shapes or column range")
    cdef float[::1] packed = np.empty(brnn_packed_size(K, N) + 1, dtype=np.float32)
    cdef Py_ssize_t sk = w.strides[0] // 4, sn = w.strides[1] // 4
    with nogil:
        if K > 0 and N > 0:
            brnn_pack_wide_f32(K, N, &w[0, 0], sk, sn, &packed[0])
        fn(K, &a[0] if K > 0 else NULL, &packed[0], N, n0, n1, accumulate,
           &c[0] if N > 0 else NULL)


def row1_gates_memview(const float[::1] a, const float[:, :] w, int nq, str path=None):
    """a @ W through the fused batch-1 step's kernel (for its tests): W [K, nq*H]
    (any strides, gate q in columns [q*H, q*H + H)) packed gate-interleaved
    (brnn_pack_gates_f32), then variant `path`'s kernel (avx512 or avx2; this
    process's by default) on each 16-cell panel; returns [nq*H] in W's column
    order."""
    cdef Py_ssize_t K = a.shape[0], H = w.shape[1] // nq if nq > 0 else 0
    cdef int p = packed_path if path is None else PACKED_PATHS.get(path, -1)
    cdef brnn_row1_gates_fn fn = brnn_row1_gates_kernel(p) if p >= 0 else NULL
    if p < 0 or not brnn_packed_path_supported(p) or fn == NULL:
        raise ValueError(f"row1_gates_memview: path {path!r} has no fused-step kernel here")
    if nq not in (3, 4) or w.shape[0] != K or H == 0 or w.shape[1] != nq * H:
        raise ValueError("row1_gates_memview: W must be [K, nq*H], nq 3 or 4, H > 0")
    cdef Py_ssize_t panels = (H + BRNN_NR - 1) // BRNN_NR, q, j, n
    cdef float[::1] packed = np.empty(panels * BRNN_NR * nq * K + 1, dtype=np.float32)
    cdef float[:, ::1] out = np.empty((panels, nq * BRNN_NR), dtype=np.float32)
    cdef Py_ssize_t sk = w.strides[0] // 4, sn = w.strides[1] // 4
    with nogil:
        if K > 0:
            brnn_pack_gates_f32(K, H, nq, &w[0, 0], sk, sn, &packed[0])
        for n in range(panels):
            fn(K, &a[0] if K > 0 else NULL, &packed[n * BRNN_NR * nq * K], nq, &out[n, 0])
    res = np.empty(nq * H, dtype=np.float32)
    for q in range(nq):
        for j in range(H):
            res[q * H + j] = out[j // BRNN_NR, q * BRNN_NR + j % BRNN_NR]
    return res


def packed_kernel_name():
    """The packed-kernel variant this process runs (avx512, avx2 or portable)."""
    return {v: k for k, v in PACKED_PATHS.items()}[packed_path]


def packed_product_memview(const float[:, ::1] a, const float[:, :] w, bint accumulate,
                           float[:, ::1] c, str path=None, Py_ssize_t n0=0,
                           Py_ssize_t n1=-1, int repeat=1, bint driver=False):
    """C[:, n0:n1] (+)= A @ W[:, n0:n1] through the packed kernel (for its tests):
    W [K, N] (any strides) packed, then one call of the variant `path` (this
    process's by default; one the CPU cannot run raises ValueError): its own
    function, or with `driver` the one every float32 product runs
    (brnn_gemm_kernel: on AVX-512 its 12 x 32 and few-row 6 x 64 tiles).
    A [rows, K], C [rows, N]; n0 a multiple of 16. `repeat` runs the
    product that many times on the one packing (to time the kernel alone)."""
    cdef Py_ssize_t rows = a.shape[0], K = a.shape[1], N = w.shape[1]
    cdef int p = packed_path if path is None else PACKED_PATHS.get(path, -1)
    if p < 0 or not brnn_packed_path_supported(p):
        raise ValueError(f"packed_product_memview: path {path!r} is not one of "
                         f"{packed_paths_supported()}")
    if n1 < 0:
        n1 = N
    if (w.shape[0] != K or c.shape[0] != rows or c.shape[1] != N or rows == 0
            or not 0 <= n0 <= n1 <= N or n0 % BRNN_NR):
        raise ValueError("packed_product_memview: inconsistent shapes or column range")
    cdef float[::1] packed = np.empty(brnn_packed_size(K, N) + 1, dtype=np.float32)
    cdef brnn_packed_fn fn = brnn_gemm_kernel(p) if driver else brnn_packed_kernel(p)
    cdef Py_ssize_t sk = w.strides[0] // 4, sn = w.strides[1] // 4
    with nogil:
        brnn_pack_f32(K, N, &w[0, 0] if K > 0 and N > 0 else NULL, sk, sn, &packed[0])
        for _ in range(repeat):
            fn(rows, K, &a[0, 0] if K > 0 else NULL, K, &packed[0], n0, n1, accumulate,
               &c[0, 0], N)


def sequence_threads_for(Py_ssize_t B, Py_ssize_t K, Py_ssize_t N, Py_ssize_t H, int limit):
    """sequence_threads: the threads a float32 training sequence loop asks of
    the budget (for the tests)."""
    return sequence_threads(B, K, N, H, limit)


def gru_sequence_threads_for(Py_ssize_t B, Py_ssize_t H, int limit):
    """gru_sequence_threads: the threads a float32 training loop of a GRU asks
    of the budget (for the tests)."""
    return gru_sequence_threads(B, H, limit)


def sequence_patient_for(Py_ssize_t B, Py_ssize_t K, Py_ssize_t N, int n_threads):
    """sequence_patient: whether a training loop's step barrier is patient
    with a stalled partner (for the tests)."""
    return sequence_patient(B, K, N, n_threads)


def gates_by_rows_for(Py_ssize_t B, int n_threads):
    """gates_by_rows: whether a sequence loop on n_threads threads splits its
    gate math by rows (for the tests)."""
    return gates_by_rows(B, n_threads)


def packed_input_threads_for(Py_ssize_t rows, Py_ssize_t I, Py_ssize_t N, Py_ssize_t H,
                             int limit):
    """packed_input_threads: the threads a batch-1 forward's input projection
    [rows, I] @ [I, N] over H cells asks of the budget (for the tests)."""
    return packed_input_threads(rows, I, N, H, limit)


def shed_barrier_answers(int cores, bint other_caller, bint patient=False):
    """brnn_barrier_wait_shed at the end of one step of a 2-thread region (for
    the tests), on a budget of `cores`; with other_caller, another caller is
    granted its own thread while the region runs. Returns the two threads'
    answers, the budget this region still holds after the barrier, and whether
    a partner stalled (it sheds then too unless `patient`): the two threads ran
    on one CPU just before the barrier, or one waited at it longer than
    BRNN_SHED_WAIT_NS (a busy process held the other's core); None if the
    region got fewer than 2 threads."""
    cdef int granted = brnn_budget_take(2, 2), tid = 0, nt = 1
    cdef int answers[2]
    cdef int cpus[2]
    cdef brnn_barrier bar
    cdef int left, others = 1 if other_caller else 0
    memset(&bar, 0, sizeof(bar))
    answers[0] = answers[1] = -1
    cpus[0] = cpus[1] = -1
    if granted == 2:
        with nogil, parallel(num_threads=2):
            tid = brnn_omp_get_thread_num()
            nt = brnn_omp_get_num_threads()
            if tid == 0 and others > 0:
                brnn_budget_take(1, 1)   # another caller: granted its thread beyond the budget
            brnn_omp_barrier()
            if nt == 2:
                cpus[tid] = brnn_current_cpu()
                answers[tid] = brnn_barrier_wait_shed(&bar, nt, cores, patient)
    left = brnn_budget_in_use() - others
    brnn_budget_give(1 if bar.shed else granted)
    if others > 0:
        brnn_budget_give(others)
    if granted != 2 or answers[1] < 0:
        return None
    stalled = (cpus[0] >= 0 and cpus[0] == cpus[1]) or bar.waited_ns > BRNN_SHED_WAIT_NS
    return (answers[0], answers[1]), left, stalled


def patient_sheds_for(long long waited_ns, long long elapsed_ns):
    """brnn_patient_sheds (for the tests): whether a patient region whose
    partners waited waited_ns of the elapsed_ns since its first barrier sheds."""
    return bool(brnn_patient_sheds(waited_ns, elapsed_ns))


def solo_spells_for(shed_times_ns):
    """The one-thread spell (ns) each of a series of sheds starts, at these
    monotonic times, on one object (brnn_solo_start_at; for the tests)."""
    cdef brnn_solo s
    s.until, s.spell = 0, 0
    spells = []
    for t in shed_times_ns:
        brnn_solo_start_at(&s, t)
        spells.append(s.spell)
    return spells


def pace_plans_for(long long one, long long many, int n):
    """What brnn_pace_plan asks n calls in a row for (2: several threads, 1:
    one), on a fresh pace holding these means (femtoseconds per multiply-add),
    at one instant, no try of several threads due (for the tests)."""
    cdef brnn_pace p
    memset(&p, 0, sizeof(p))
    p.fs_per_mac[0], p.fs_per_mac[1] = one, many
    cdef long long now = brnn_now_ns()
    p.retry_at = now + 10**12
    return [2 if brnn_pace_plan(&p, now) & BRNN_PACE_MANY else 1 for _ in range(n)]


def thread_budget_take(int want, int total):
    """brnn_budget_take (for the thread-budget tests; give the grant back)."""
    return brnn_budget_take(want, total)


def thread_budget_give(int n):
    """brnn_budget_give (for the thread-budget tests)."""
    brnn_budget_give(n)


def thread_budget_in_use():
    """blockrnn's threads in use by running sequence calls in this process."""
    return brnn_budget_in_use()



cdef enum:
    # The training loops' threads: the LSTM's of 2+ rows (sequence_threads),
    # the GRUs' and the projected LSTM's at every batch size
    # (gru_sequence_threads, lstm_proj_step_threads), whose steps shed a
    # partner thread that stalls (step_barrier): a second thread from 2^16
    # multiply-adds of a step's recurrent products (B x H x 4H, 3H for the
    # GRUs, B x P x 5H projected). Measured on the LSTM on a quiet 2-core
    # Zen 4 VM, T=50, I=H, 2 threads / 1 (forward, backward): batch 2 H=128
    # 0.70, 0.78; batch 4 H=64 0.92, 0.91; batch 8 H=64 0.85, 0.87, H=128
    # 0.65, 0.85; batch 16 H=128 backward 0.79; below 2^16, batch 8 H=32 1.13,
    # 1.11 and batch 2 H=64 backward 1.14. With a busy process on the other
    # core the 2-thread call sheds at its first stall: batch 8 H=128 1.06x,
    # 1.07x the one-thread time (1.41x, 1.25x when patient). (Until stops
    # 46-47 the loops asked for one thread per 2^20, measured on a loaded
    # machine before any loop could shed: LSTM forward 50,1,128,128 0.69 ms
    # on 1 thread, 15.6 ms on 2.)
    SEQUENCE_WORK_PER_THREAD = 1 << 15
    # Sequence calls of fewer rows do not run the tiled route: at one row a
    # tile is one FMA chain per panel (a GEMV per step beat it: 0.60 vs 0.82 ms
    # for the LSTM forward at 50,1,128,128, GRU 0.32 vs 0.41, LSTM backward
    # 0.54 vs 0.70; at two rows the packed kernel won, LSTM forward 1.0 vs
    # 11 ms, GRU 0.7 vs 10.8, on a loaded machine). Both GRUs' backwards run
    # batch 1 on BLAS below PACKED_ROW1_MIN_CELLS; the LSTM's loops and both
    # GRUs' forwards run every batch size on the packed loops (batch 1 on the
    # wide one-row kernel, _lstm.pxi).
    PACKED_MIN_ROWS = 2
    # ... except from this many cells on, where both GRUs' batch-1 backwards run
    # the packed loops too: their threads split W_hh^T's panels, which a GEMV on the
    # calling thread reads whole at every step. Measured (2-core Xeon VM, AVX-512,
    # T = 50, I = H, fresh processes, packed / GEMV, reset-after and TF GRU, best ms):
    # H = 512 on 2 threads 4.1-4.6 / 8.0-8.3, on 1 thread 8.9-9.9 / 8.8-10.3; H = 384
    # on 2 threads 2.3-2.7 / 2.8-4.0, on 1 thread 2.8-3.4 / 3.0-4.0; H = 256 on 2
    # threads 1.15-1.4 / 1.06-1.28, on 1 thread 1.6-1.8 / 1.3-1.7 (lost); H = 128
    # 0.35-0.40 / 0.28-0.40 (lost). A rule of the shape alone: the route decides
    # the bits.
    PACKED_ROW1_MIN_CELLS = 384


cdef inline bint gru_backward_packed_route(Py_ssize_t B, Py_ssize_t H) noexcept nogil:
    """Whether a float32 GRU backward (either variant) runs its steps on the packed
    loop rather than a GEMV per step on the calling thread: from PACKED_MIN_ROWS
    rows, and batch 1 from PACKED_ROW1_MIN_CELLS cells."""
    return B >= PACKED_MIN_ROWS or H >= PACKED_ROW1_MIN_CELLS


cdef inline int step_threads(Py_ssize_t step_work, Py_ssize_t per_thread, Py_ssize_t H,
                             int limit) noexcept nogil:
    """Threads a loop whose steps take step_work multiply-adds, split by
    16-column panels of H, asks of the budget: one per per_thread of them, at
    most one per panel, at most `limit`, at least 1."""
    return <int>max(1, min(step_work // per_thread, (H + BRNN_NR - 1) // BRNN_NR,
                           <Py_ssize_t>limit))


cdef inline Py_ssize_t unit_start(Py_ssize_t H, int tid, int nt) noexcept nogil:
    """First cell of thread tid of nt (thread nt ends at H): whole 16-column
    panels, split evenly. (A function of the arguments only: values assigned
    inside a Cython parallel block are what makes them thread-private.)"""
    cdef Py_ssize_t panels = (H + BRNN_NR - 1) // BRNN_NR
    return min(H, tid * panels // nt * BRNN_NR)


cdef inline int sequence_threads(Py_ssize_t B, Py_ssize_t K, Py_ssize_t N, Py_ssize_t H,
                                 int limit) noexcept nogil:
    """Threads a float32 training loop of the LSTM (and the reset-after GRU's
    forward) asks of the budget by its
    steps (loop_threads then keeps a short call on one), its
    steps' recurrent product [B, K] @ [K, N] over H cells (the input
    projection is hoisted out of the steps): one per INFER_WORK_PER_THREAD
    multiply-adds of a step at batch 1 (the inference forward's rule for its
    one-row steps), per SEQUENCE_WORK_PER_THREAD from 2 rows on (their gate
    math by rows adds a barrier, gates_by_rows); at most one per 16-cell
    panel, at most `limit`, at least 1."""
    return step_threads(B * K * N,
                        INFER_WORK_PER_THREAD if B == 1 else SEQUENCE_WORK_PER_THREAD, H, limit)


cdef enum:
    # Below these multiply-adds of its whole region a float32 training loop runs
    # on one thread, whatever its steps' rule asks (loop_threads): the partner of
    # a short call is asleep (GOMP_SPINCOUNT=1000) and its wake-up costs more than
    # its share saves. Raw ops, 2-core Zen 4 VM, fresh processes, p25, 1 thread /
    # 2 threads in us: backwards (T x B x nq*H x H) lost at T=1 at every shape
    # (LSTM B=8 H=256, 2.1M: 344-348 / 405-462; reset-after GRU B=16 H=128, 0.8M:
    # 100-103 / 154-183), at T=2 B=16 H=128 (LSTM, 2.1M: 221-222 / 238-251) and
    # T=4 B=32 H=64 (LSTM, 2.1M: 206 / 221-223), and won from 3.1M (reset-after
    # GRU T=2 B=8 H=256: 335-339 / 230-256; T=4 B=16 H=128: 280-281 / 189-194).
    # Forwards (with the projection: T x B x (I+H) x nq*H) lost at T=1 B=8 H=128
    # (reset-after GRU, 0.8M: 44-45 / 48; LSTM, 1.0M: 40-42 / 98-100 in one run,
    # 38-50 on 2 threads in another) and won from 1.6M (reset-after GRU T=2 B=8
    # H=128: 61 / 57-58; T=1 B=16 H=128: 60-61 / 54).
    LOOP_MIN_WORK_FORWARD = 3 << 19
    LOOP_MIN_WORK_BACKWARD = 3 << 20
    # The projected LSTM's two loops (_lstm_proj.pxi; their regions hold the
    # steps' products only, L x B x 5HP: the input projection and the
    # backward's weight products run on the GEMM driver's threads), same
    # method, I=H, 1 thread / 2 threads in us: T=1 B=8 H=128 P=64 (0.3M)
    # forward 51 / 90-112, backward 81 / 117-141; T=2 B=16 H=128 P=64 (1.3M)
    # 105-106 / 130-137, 179-181 / 209; P=96 (2.0M) 120-121 / 143-147,
    # 207 / 237; T=3 (2.9M) 162-163 / 146-149, 282-305 / 211-214; T=4 (3.9M)
    # 204-205 / 169-173, 357-360 / 253-277. (Left out: processes where glibc
    # gave the heap's top back to the OS after every call, whose calls all ran
    # 2-3x slower on either thread count, docs/performance.md.)
    LOOP_MIN_WORK_PROJ = 5 << 19


cdef inline int loop_threads(int threads, Py_ssize_t work, Py_ssize_t min_work) noexcept nogil:
    """The threads a float32 training loop whose region does `work`
    multiply-adds asks of the budget: `threads` (its steps' rule,
    sequence_threads, gru_sequence_threads or lstm_proj_step_threads), or one
    below min_work (LOOP_MIN_WORK_FORWARD: the steps' products and the
    hoisted projection; LOOP_MIN_WORK_BACKWARD: the products of a chunk's
    reverse loop; LOOP_MIN_WORK_PROJ: a projected LSTM loop's products)."""
    return threads if work >= min_work else 1


def loop_threads_for(int threads, Py_ssize_t work, str loop):
    """loop_threads with the threshold of a "forward" or "backward" loop (for
    the tests; the projected LSTM's: lstm_proj_loop_threads_for)."""
    cdef dict min_work = {"forward": LOOP_MIN_WORK_FORWARD, "backward": LOOP_MIN_WORK_BACKWARD}
    return loop_threads(threads, work, min_work[loop])


cdef inline int gru_sequence_threads(Py_ssize_t B, Py_ssize_t H, int limit) noexcept nogil:
    """Threads a float32 training loop of a GRU asks of the budget by its
    steps (TF's forward and backward, the reset-after GRU's backward; its
    forward asks by the LSTM's rule, sequence_threads; loop_threads
    then keeps a short call on one): one per
    SEQUENCE_WORK_PER_THREAD multiply-adds of a step's recurrent products
    (B x H x 3H) at every batch size, batch 1 included (unlike the LSTM's,
    sequence_threads); at most one per 16-cell panel, at most `limit`, at
    least 1. Batch 1, T=50, I=H, quiet 2-core Zen 4 VM, forward p25 2 threads
    / 1, calls alternating in one process: TF GRU (two barriers a step)
    H=128 1.07-1.23 (kept on 1), H=160 1.04, H=192 0.99, H=224 0.88, H=256
    0.76; the reset-after GRU's batch-1 loop of then (packing and input
    projection outside its region) H=128 1.15-1.16, H=160 0.95, H=192 0.94,
    H=256 0.73 (its one-region loop now: block_gru_ra_forward_compute)."""
    return step_threads(B * H * 3 * H, SEQUENCE_WORK_PER_THREAD, H, limit)


cdef inline bint patient_with_stalls(Py_ssize_t step_work, int n_threads) noexcept nogil:
    """Whether a call whose step is step_work multiply-adds on n_threads is
    patient with a stalled partner (brnn_barrier_wait_shed): while a step gives
    each thread at most INFER_SHORT_STEP_WORK multiply-adds (~10 us) it sheds
    at the first stall (a stall is 1 ms or more), else only once the waits add
    up (brnn_patient_sheds). The one rule of the inference calls
    (infer_patient) and the training loops (sequence_patient)."""
    return step_work > INFER_SHORT_STEP_WORK * <Py_ssize_t>n_threads


cdef inline bint sequence_patient(Py_ssize_t B, Py_ssize_t K, Py_ssize_t N,
                                  int n_threads) noexcept nogil:
    """Whether the step barrier of a training loop (LSTM, GRUs) on
    n_threads, steps' recurrent product [B, K] @ [K, N], is patient with a
    stalled partner (patient_with_stalls)."""
    return patient_with_stalls(B * K * N, n_threads)


cdef inline bint step_barrier(brnn_barrier* bar, int nt, int cores,
                              bint patient) noexcept nogil:
    """The barrier that ends a step of a training loop on nt threads:
    True if the call goes on with thread 0 alone (brnn_barrier_wait_shed:
    another caller needed a thread, or a partner thread stalled; `patient`:
    sequence_patient), the same answer on every thread. The loop then hands
    thread 0 every cell and every row (the split never changes a bit)."""
    return brnn_barrier_wait_shed(bar, nt, cores, patient)


cdef inline int region_threads(brnn_barrier* bar, int granted) noexcept nogil:
    """After a loop that took `granted` threads of the budget: how many it
    gives back (one, if it shed: the shedding barrier gave back the others)."""
    return 1 if bar.shed else granted


cdef inline bint gates_by_rows(Py_ssize_t B, int n_threads) noexcept nogil:
    """Whether a sequence loop on n_threads threads computes each step's gate
    math by rows (thread k: every cell of its block of rows, after a barrier
    that follows the product) rather than by the cells whose product columns
    it computed (no barrier between the two): whenever every thread gets a
    row. The cell split leaves each thread half (a 1/n_threads slice) of
    every row of a dozen [B, H] arrays to read and write, and on a 2-core
    Zen 4 that half-row pass took as long as one thread's pass over whole
    rows (C loop of brnn_lstm_forward_row_f32 over 100 steps of 32 x 256,
    1 thread 2.0 ms, 2 threads by cells 1.9-2.0, by rows 1.05; one thread on
    half of each row 1.4-2.0, on half of the rows 1.0). Against the cell
    split, in one process alternating the two (2 threads, median of 8 rounds):
    LSTM forward 100,32,256,256 -5%, fwd+bwd -3%, inference -2%; reset-after
    GRU fwd+bwd -5%, inference -4 to -8% at batch 8 to 32; 100,64,512,512
    LSTM forward -6%, fwd+bwd -5%; batch 2-4 equal to 4% better. The TF GRU
    (a barrier after each of its two products) and the projected LSTM, fresh
    processes alternated at 100,32,256,256: TF GRU forward -10%, inference
    -13%, projected LSTM forward -7% (docs/performance.md)."""
    return B >= n_threads


cdef enum:
    # From SPLIT_ROWS rows a thread, a time loop splits the batch between its
    # threads instead of the cells (split_rows): each runs every step of its
    # own rows, with no barrier in the time loop, where the split by cells
    # waits at one or two barriers a step. Measured on the 2-core Zen 4 VM
    # (AVX-512), T=64, I=H, 2 threads, in one process alternating the two
    # splits (8 rounds, median of each round's p10), inference forward, time
    # by rows / by cells: LSTM B=8 H=128 0.81, B=16 H=64 0.90, B=8 H=256
    # 1.00; reset-after GRU B=8 H=128 0.92, B=16 H=256 0.94, B=32 H=128 1.00;
    # TF GRU B=8 H=128 0.88, B=12 H=64 0.78. At 3 rows a thread it lost (LSTM
    # B=6 H=128 1.08): a tile of 3 rows is the packed kernel's slowest per row
    # (one thread, us per row at B=3 / 4 / 8: 227 / 177 / 166).
    SPLIT_ROWS = 4
    SPLIT_MAX_THREADS = 64


# A time loop split by rows: what its threads tell each other and the caller.
ctypedef struct RowSplit:
    int nt          # the region's threads
    int stop        # thread 0 ran all its steps: the others stop at the end of a step
    int over        # a thread left because another caller needed it
    int given       # threads given back to the budget inside the region
    Py_ssize_t resume[SPLIT_MAX_THREADS]   # thread k's rows: where their steps not run start


cdef inline bint split_rows(Py_ssize_t B, int threads) noexcept nogil:
    """Whether a time loop of B rows on `threads` threads splits its rows
    rather than its cells (SPLIT_ROWS rows a thread or more)."""
    return 1 < threads <= SPLIT_MAX_THREADS and B >= SPLIT_ROWS * threads


def split_rows_for(Py_ssize_t B, int threads):
    """split_rows (for the tests)."""
    return split_rows(B, threads)


cdef inline bint rows_leave(RowSplit* sp, int tid, int cores) noexcept nogil:
    """At the end of a step of a loop split by rows, with steps left: whether
    thread tid leaves now, giving its thread back: not thread 0 (the caller's),
    and the budget is over-committed (another caller needs a thread) or thread
    0 has run all its steps (this one is behind: it started late, or another
    process holds its core). The caller then runs the rest of its rows' steps
    after the region: every row's steps run the same code on any thread."""
    cdef bint over
    if tid == 0:
        return False
    over = brnn_budget_overcommitted(cores)
    if not over and not brnn_atomic_load(&sp.stop):
        return False
    if over:
        brnn_atomic_add(&sp.over, 1)
    brnn_atomic_add(&sp.given, 1)
    brnn_budget_give(1)
    return True


cdef inline void rows_done(RowSplit* sp, int tid, Py_ssize_t resume) noexcept nogil:
    """Thread tid of a loop split by rows stops, its rows' steps from `resume`
    on not run (the loop's end if it ran them all: thread 0 always does, and
    then tells the others to stop)."""
    sp.resume[tid] = resume
    if tid == 0:
        sp.nt = brnn_omp_get_num_threads()
        brnn_atomic_add(&sp.stop, 1)


cdef inline void gate_math_block(brnn_barrier* rows_bar, int nt, brnn_barrier* step_bar,
                                 Py_ssize_t H, Py_ssize_t* u0, Py_ssize_t* u1,
                                 Py_ssize_t* r0, Py_ssize_t* r1) noexcept nogil:
    """Once a thread's product columns of a step are written: the block of the
    step's gate math it computes. With rows_bar (gates_by_rows), after a
    barrier of the nt threads (one within the shedding barrier step_bar if
    not NULL, brnn_barrier_wait_within), its rows [r0, r1) over every cell:
    u0, u1 = 0, H (its product covered every row of its cells); without, the
    block its product covered, the cells [u0, u1) of the rows [r0, r1)
    (unchanged): every row in a split by cells, its own rows over every cell
    in a split by rows (split_rows)."""
    if rows_bar != NULL:
        if step_bar != NULL:
            brnn_barrier_wait_within(rows_bar, nt, step_bar)
        else:
            brnn_barrier_wait(rows_bar, nt)
        u0[0], u1[0] = 0, H


cdef enum:
    # Multiply-adds per thread of a batch-1 sequence's whole input projection
    # below which it stays on one thread (no barrier in it: the TF GRU's
    # forward region takes more threads than its steps for it,
    # block_gru_forward_compute).
    PACKED_INPUT_WORK_PER_THREAD = 1 << 22


cdef inline int packed_input_threads(Py_ssize_t rows, Py_ssize_t I, Py_ssize_t N, Py_ssize_t H,
                                     int limit) noexcept nogil:
    """Threads a hoisted input projection [rows, I] @ [I, N] over H cells
    asks of the budget: one per PACKED_INPUT_WORK_PER_THREAD multiply-adds,
    at most one per 16-cell panel, at most `limit`, at least 1
    (step_threads)."""
    return step_threads(rows * I * N, PACKED_INPUT_WORK_PER_THREAD, H, limit)


cdef enum:
    # Floats of x per block of rows of packed_inputs_part: the block (128 KB)
    # stays in L2 while the thread's panels of W_x pass over it, each panel
    # (16 x I floats) in L1. Measured in one process, calls alternated, 12
    # each, 1 thread, loaded 2-core Sapphire Rapids, whole training forward
    # (best ms) at 2^13 / 2^15 / 2^17 floats / all L*B rows in one block:
    # LSTM 100,32,256,256 23.4 / 23.3 / 23.6 / 25.2; 100,64,512,512 196.6 /
    # 193.7 / 196.5 / 202.7; reset-after GRU 100,64,512,512 134.2 / 127.6 /
    # 129.8 / 139.9 (without blocks, x's rows are streamed from L3 for every
    # panel: the hoist then lost to the per-step product).
    PACKED_INPUT_BLOCK_FLOATS = 1 << 15


cdef void packed_inputs_part(
        Py_ssize_t rows, Py_ssize_t I, Py_ssize_t H, int nq,
        const float* x,           # IN  [rows, I]
        const float* packed_x,    # IN  nq gate blocks [I, H], block q packed at q * stride
        Py_ssize_t stride,
        float** dst,              # OUT nq arrays [rows, H]
        Py_ssize_t u0, Py_ssize_t u1) noexcept nogil:
    """dst[q][:, u0:u1] = (x @ W_x block q)[:, u0:u1], q < nq: one thread's
    cells of a hoisted input projection, in blocks of rows of x (a multiple
    of 12, the AVX-512 tile's rows; PACKED_INPUT_BLOCK_FLOATS floats). Each
    element is the packed kernel's one sum over k = 0..I-1, as a per-step
    product x[t] @ W_x's: the same bits whatever the blocking, the rows
    computed together or the thread."""
    cdef Py_ssize_t r0 = 0, mc
    cdef Py_ssize_t block = max(12, PACKED_INPUT_BLOCK_FLOATS // max(I, 1) // 12 * 12)
    cdef int q
    if u1 <= u0:
        return
    while r0 < rows:
        mc = min(block, rows - r0)
        for q in range(nq):
            packed_product(mc, I, x + r0 * I, I, packed_x + q * stride, u0, u1, False,
                           dst[q] + r0 * H, H)
        r0 += mc


# ---------------------------------------------------------------------------
# The deterministic GEMM driver (include/brnn_gemm.h) on blockrnn's threads
# ---------------------------------------------------------------------------

cdef enum:
    # Multiply-adds per thread of a driver call below which a further thread
    # is not asked for (4M multiply-adds: ~0.1 ms of one core).
    PACKED_GEMM_WORK_PER_THREAD = 1 << 22


cdef inline int packed_gemm_threads(Py_ssize_t work, int limit) noexcept nogil:
    """Threads packed_gemm_jobs asks of the budget for `work` multiply-adds:
    one per PACKED_GEMM_WORK_PER_THREAD, at most `limit`, at least 1. A
    caller sizes its workspace with this (packed_gemm_threads(...) times
    brnn_gemm_jobs_ws(jobs) floats, or a bound of it) before the call."""
    return <int>max(1, min(work // PACKED_GEMM_WORK_PER_THREAD, limit))


def packed_gemm_threads_for(Py_ssize_t work, int limit):
    """packed_gemm_threads (for the tests)."""
    return packed_gemm_threads(work, limit)


def packed_gemm_k_blocks():
    """(BRNN_GEMM_KC, BRNN_DGEMM_KC): the K blocks of the float32 and float64
    GEMM drivers, on which their bits depend (for the tests)."""
    return BRNN_GEMM_KC, BRNN_DGEMM_KC


def packed_gemm_ws_for(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K):
    """brnn_gemm_ws: floats of one thread's driver block for C [M, N], K (for
    the tests)."""
    return brnn_gemm_ws(M, N, K)


def packed_dgemm_ws_for(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K):
    """brnn_dgemm_ws: doubles of one thread's float64 driver block for C [M, N],
    K (for the tests)."""
    return brnn_dgemm_ws(M, N, K)


cdef inline Py_ssize_t gemm_ws_of(bint f32, Py_ssize_t M, Py_ssize_t N,
                                  Py_ssize_t K) noexcept nogil:
    """Elements of one thread's driver block: brnn_gemm_ws (float32) or
    brnn_dgemm_ws (float64)."""
    return brnn_gemm_ws(M, N, K) if f32 else brnn_dgemm_ws(M, N, K)


cdef inline brnn_gemm_job gemm_job(
        Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, const float* a, Py_ssize_t sam,
        Py_ssize_t sak, const float* b, Py_ssize_t sbk, Py_ssize_t sbn, bint accumulate,
        float* c, Py_ssize_t ldc) noexcept nogil:
    """C[M, N] (+)= A[M, K] @ B[K, N] with A(m, k) = a[m*sam + k*sak] and
    B(k, n) = b[k*sbk + n*sbn], C row stride ldc (include/brnn_gemm.h); the
    driver packs B (a job's bp set to B packed beforehand spares it that)."""
    cdef brnn_gemm_job j
    j.M, j.N, j.K = M, N, K
    j.a, j.sam, j.sak = a, sam, sak
    j.b, j.sbk, j.sbn = b, sbk, sbn
    j.accumulate = accumulate
    j.c, j.ldc = c, ldc
    j.bp = NULL
    return j


cdef void packed_gemm_jobs(int njobs, const brnn_gemm_job* jobs, float* ws,
                           int threads) noexcept nogil:
    """The products `jobs`, in order, in the packed kernel through the driver
    of include/brnn_gemm.h, on up to `threads` threads from the thread budget
    (one OpenMP region for all jobs). ws: threads * brnn_gemm_jobs_ws(njobs,
    jobs) floats, one block per thread (BRNN_GEMM_WS at most). Threads split
    rows or column panels of each C, never K: the bits do not depend on the
    thread count. A job may accumulate onto an
    earlier job's C only if both have the same M and N (include/brnn_gemm.h)."""
    cdef int tid = 0, nt = 1, granted
    cdef Py_ssize_t stride = brnn_gemm_jobs_ws(njobs, jobs)
    granted = brnn_budget_take(threads, threads)
    if granted == 1:  # no OpenMP region at all: cheaper, and safe after fork
        brnn_gemm_jobs_f32(packed_product, njobs, jobs, 0, 1, ws)
    else:
        with parallel(num_threads=granted):
            tid = brnn_omp_get_thread_num()
            nt = brnn_omp_get_num_threads()
            brnn_gemm_jobs_f32(packed_product, njobs, jobs, tid, nt, ws + tid * stride)
    brnn_budget_give(granted)


cdef void packed_dgemm_jobs(int njobs, const brnn_dgemm_job* jobs, double* ws,
                            int threads) noexcept nogil:
    """packed_gemm_jobs for float64: the double driver of include/brnn_gemm.h
    (ws: threads * brnn_dgemm_jobs_ws(njobs, jobs) doubles); the same rules."""
    cdef int tid = 0, nt = 1, granted
    cdef Py_ssize_t stride = brnn_dgemm_jobs_ws(njobs, jobs)
    granted = brnn_budget_take(threads, threads)
    if granted == 1:  # no OpenMP region at all: cheaper, and safe after fork
        brnn_gemm_jobs_f64(dgemm_product, njobs, jobs, 0, 1, ws)
    else:
        with parallel(num_threads=granted):
            tid = brnn_omp_get_thread_num()
            nt = brnn_omp_get_num_threads()
            brnn_gemm_jobs_f64(dgemm_product, njobs, jobs, tid, nt, ws + tid * stride)
    brnn_budget_give(granted)


cdef inline Py_ssize_t dpacked_size(Py_ssize_t K, Py_ssize_t N) noexcept nogil:
    """Doubles of brnn_pack_f64's copy of a [K, N] block (8-double panels)."""
    return (N + 7) // 8 * 8 * K


cdef inline int projection_threads(Py_ssize_t rows, Py_ssize_t I, Py_ssize_t G,
                                   int max_threads) noexcept nogil:
    """Threads of a float64 forward's hoisted input projection x[:L] @ W_x (rows = L*B,
    G gate columns) through the GEMM driver (run_gemm_specs)."""
    return packed_gemm_threads(rows * I * G, max_threads)


cdef void dgemm_step(Py_ssize_t rows, Py_ssize_t K, const double* a, Py_ssize_t lda,
                     const double* packed, Py_ssize_t N, bint accumulate, double* c,
                     Py_ssize_t ldc, int n_threads) noexcept nogil:
    """C[rows, :N] (+)= A[rows, K] @ W, W [K, N] packed once per call (brnn_pack_f64):
    a float64 per-step recurrent product on blockrnn's own kernel (OpenBLAS's GEMM
    would repack W at every step), its 16-column blocks split over up to n_threads
    threads taken from the thread budget (what is free: concurrent callers never
    oversubscribe). Each element is one in-order sum over K, so the split changes
    no bit."""
    cdef Py_ssize_t blocks = (N + 15) // 16, n0, n1
    cdef int j, granted
    if n_threads <= 1 or blocks < 2 or rows * K * N < STEP_PARALLEL_MACS:
        dgemm_product(rows, K, a, lda, packed, 0, N, accumulate, c, ldc)
        return
    granted = brnn_budget_take(<int>min(n_threads, blocks), n_threads)
    if granted == 1:
        dgemm_product(rows, K, a, lda, packed, 0, N, accumulate, c, ldc)
    else:
        for j in prange(granted, num_threads=granted, schedule="static"):
            n0 = blocks * j // granted * 16
            n1 = min(N, blocks * (j + 1) // granted * 16)
            dgemm_product(rows, K, a, lda, packed, n0, n1, accumulate, c, ldc)
    brnn_budget_give(granted)


cdef enum:
    GEMM_SPECS_MAX = 8   # jobs of one run_gemm_specs call, at most
    # dgemm_step splits a product from this many multiply-adds on (an OpenMP region
    # costs a few microseconds)
    STEP_PARALLEL_MACS = 1 << 18


cdef struct gemm_spec:
    # One driver job of either precision (gemm_job's fields; the pointers are
    # float* or double* as the run_gemm_specs call's ws). bp: float32's B
    # packed beforehand (read_packed_bs), or NULL; float64 packs its B itself.
    Py_ssize_t M, N, K, sam, sak, sbk, sbn, ldc
    const void* a
    const void* b
    void* c
    bint accumulate
    const void* bp


cdef inline gemm_spec gspec(
        Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, const void* a, Py_ssize_t sam,
        Py_ssize_t sak, const void* b, Py_ssize_t sbk, Py_ssize_t sbn, bint accumulate,
        void* c, Py_ssize_t ldc) noexcept nogil:
    """A job C[M, N] (+)= A @ B of either precision, as gemm_job."""
    cdef gemm_spec j
    j.M, j.N, j.K = M, N, K
    j.a, j.sam, j.sak = a, sam, sak
    j.b, j.sbk, j.sbn = b, sbk, sbn
    j.accumulate = accumulate
    j.c, j.ldc = c, ldc
    j.bp = NULL
    return j


cdef Py_ssize_t packed_bs_size(int njobs, const gemm_spec* jobs) noexcept nogil:
    """Floats of the float32 jobs' B packed back to back by pack_bs."""
    cdef Py_ssize_t n = 0
    cdef int i
    for i in range(njobs):
        n += brnn_gemm_prepacked_size(jobs[i].K, jobs[i].N)
    return n


cdef void pack_bs(int njobs, const gemm_spec* jobs, float* bp) noexcept nogil:
    """bp [packed_bs_size] = the float32 jobs' B packed back to back for the
    driver of include/brnn_gemm.h (brnn_gemm_prepack_b): once for every call
    that shares them (the weight of the x gradient, in every chunk of a
    backward and on every thread; their A and C are not read)."""
    cdef int i
    for i in range(njobs):
        brnn_gemm_prepack_b(jobs[i].K, jobs[i].N, <const float*>jobs[i].b, jobs[i].sbk,
                            jobs[i].sbn, bp)
        bp += brnn_gemm_prepacked_size(jobs[i].K, jobs[i].N)


cdef void read_packed_bs(int njobs, gemm_spec* jobs, const float* bp) noexcept nogil:
    """The jobs read their B from bp, packed there by pack_bs (the same bits);
    bp NULL (float64) leaves them packing it themselves."""
    cdef int i
    if bp == NULL:
        return
    for i in range(njobs):
        jobs[i].bp = bp
        bp += brnn_gemm_prepacked_size(jobs[i].K, jobs[i].N)


cdef inline gemm_spec gspec_c(
        Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, const void* a, Py_ssize_t sam,
        Py_ssize_t sak, const void* b, Py_ssize_t sbk, Py_ssize_t sbn, bint accumulate,
        void* c, Py_ssize_t scm, Py_ssize_t scn) noexcept nogil:
    """gspec for a C of element strides (scm, scn), C(m, n) = c[m*scm + n*scn]:
    row-major C (scn == 1, row stride scm) as gspec, else C stored transposed
    (scm == 1, row stride scn) as the job C^T [N, M] (+)= B^T @ A^T. Each
    element is the same sum over K either way (include/brnn_gemm.h: its bits
    depend on K and the kernel variant only)."""
    if scn == 1:
        return gspec(M, N, K, a, sam, sak, b, sbk, sbn, accumulate, c, scm)
    return gspec(N, M, K, b, sbn, sbk, a, sak, sam, accumulate, c, scn)


cdef void run_gemm_specs(int njobs, const gemm_spec* specs, floating* ws,
                         int threads) noexcept nogil:
    """The jobs `specs` (at most GEMM_SPECS_MAX) through the driver of ws's
    precision: packed_gemm_jobs (float32) or packed_dgemm_jobs (float64), on
    up to `threads` threads from the budget; ws: threads * the driver's
    jobs_ws elements."""
    cdef brnn_gemm_job fj[GEMM_SPECS_MAX]
    cdef brnn_dgemm_job dj[GEMM_SPECS_MAX]
    cdef int i
    for i in range(njobs):
        if floating is float:
            fj[i] = gemm_job(specs[i].M, specs[i].N, specs[i].K, <const float*>specs[i].a,
                             specs[i].sam, specs[i].sak, <const float*>specs[i].b,
                             specs[i].sbk, specs[i].sbn, specs[i].accumulate,
                             <float*>specs[i].c, specs[i].ldc)
            fj[i].bp = <const float*>specs[i].bp
        else:
            dj[i].M, dj[i].N, dj[i].K = specs[i].M, specs[i].N, specs[i].K
            dj[i].a, dj[i].sam, dj[i].sak = <const double*>specs[i].a, specs[i].sam, specs[i].sak
            dj[i].b, dj[i].sbk, dj[i].sbn = <const double*>specs[i].b, specs[i].sbk, specs[i].sbn
            dj[i].accumulate = specs[i].accumulate
            dj[i].c, dj[i].ldc = <double*>specs[i].c, specs[i].ldc
    if floating is float:
        packed_gemm_jobs(njobs, fj, ws, threads)
    else:
        packed_dgemm_jobs(njobs, dj, ws, threads)


def packed_dgemm_memview(const double[:, :] a, const double[:, :] b, bint accumulate,
                         double[:, ::1] c, str path=None, int parts=1, int threads=1):
    """packed_gemm_memview for float64 (the double driver of include/brnn_gemm.h,
    for its tests): C (+)= A @ B, A [M, K] and B [K, N] of any strides, C [M, N];
    `parts`, `threads` and `path` as there."""
    cdef Py_ssize_t M = a.shape[0], K = a.shape[1], N = b.shape[1]
    cdef int p = packed_path if path is None else PACKED_PATHS.get(path, -1)
    cdef int tid
    if p < 0 or not brnn_packed_path_supported(p):
        raise ValueError(f"packed_dgemm_memview: path {path!r} is not one of "
                         f"{packed_paths_supported()}")
    if b.shape[0] != K or c.shape[0] != M or c.shape[1] != N or parts < 1 or threads < 1:
        raise ValueError("packed_dgemm_memview: inconsistent shapes")
    if M == 0 or N == 0:
        return
    cdef double[::1] ws = np.empty(max(parts, threads) * BRNN_DGEMM_WS, dtype=np.float64)
    cdef brnn_dgemm_job job
    job.M, job.N, job.K = M, N, K
    job.a, job.sam, job.sak = &a[0, 0] if K > 0 else NULL, a.strides[0] // 8, a.strides[1] // 8
    job.b, job.sbk, job.sbn = &b[0, 0] if K > 0 else NULL, b.strides[0] // 8, b.strides[1] // 8
    job.accumulate = accumulate
    job.c, job.ldc = &c[0, 0], N
    cdef brnn_dgemm_fn fn = brnn_dgemm_kernel(p)
    with nogil:
        if threads > 1:
            if p != packed_path:
                with gil:
                    raise ValueError("packed_dgemm_memview: threads > 1 runs this "
                                     "process's variant only")
            packed_dgemm_jobs(1, &job, &ws[0], threads)
        else:
            for tid in range(parts):
                brnn_gemm_f64(fn, &job, tid, parts, &ws[0])


def packed_gemm_memview(const float[:, :] a, const float[:, :] b, bint accumulate,
                        float[:, ::1] c, str path=None, int parts=1, int threads=1,
                        bint prepack_b=False):
    """C (+)= A @ B through the driver of include/brnn_gemm.h (for its tests).
    A [M, K] and B [K, N] of any strides (transposed views included), C [M, N].
    `parts` > 1 runs the nt = parts thread parts one after another on this
    thread (every split the driver can make, without threads); `threads` > 1
    runs packed_gemm_jobs on up to that many threads instead. `path`: the
    kernel variant (this process's by default). `prepack_b`: B packed once
    beforehand (brnn_gemm_prepack_b, the job's bp), not by each part."""
    cdef Py_ssize_t M = a.shape[0], K = a.shape[1], N = b.shape[1]
    cdef int p = packed_path if path is None else PACKED_PATHS.get(path, -1)
    cdef int tid
    if p < 0 or not brnn_packed_path_supported(p):
        raise ValueError(f"packed_gemm_memview: path {path!r} is not one of "
                         f"{packed_paths_supported()}")
    if b.shape[0] != K or c.shape[0] != M or c.shape[1] != N or parts < 1 or threads < 1:
        raise ValueError("packed_gemm_memview: inconsistent shapes")
    if M == 0 or N == 0:
        return
    cdef float[::1] ws = np.empty(max(parts, threads) * BRNN_GEMM_WS, dtype=np.float32)
    cdef brnn_gemm_job job = gemm_job(
        M, N, K, &a[0, 0] if K > 0 else NULL, a.strides[0] // 4, a.strides[1] // 4,
        &b[0, 0] if K > 0 else NULL, b.strides[0] // 4, b.strides[1] // 4, accumulate,
        &c[0, 0], N)
    cdef float[::1] bp
    if prepack_b and K > 0:
        bp = np.empty(brnn_gemm_prepacked_size(K, N), dtype=np.float32)
        brnn_gemm_prepack_b(K, N, job.b, job.sbk, job.sbn, &bp[0])
        job.bp = &bp[0]
    cdef brnn_packed_fn fn = brnn_gemm_kernel(p)
    with nogil:
        if threads > 1:
            if p != packed_path:
                with gil:
                    raise ValueError("packed_gemm_memview: threads > 1 runs this "
                                     "process's variant only")
            packed_gemm_jobs(1, &job, &ws[0], threads)
        else:
            for tid in range(parts):
                brnn_gemm_f32(fn, &job, tid, parts, &ws[0])
