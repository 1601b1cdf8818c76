# ---------------------------------------------------------------------------
# Fast paths of the cell ops and of the LSTM and GRU sequence forwards
# (lstm_cell_fast, gru_cell_fast, block_lstm_fast, block_gru_fast): for the
# common call (C-contiguous, aligned float32/float64 ndarrays of consistent
# shapes, plain attributes, no sequence_length, a block small enough for
# serial gate loops) the checks, the output allocation and
# the kernel all happen here, in C. Anything else returns None and the Python
# layer takes the general path, which validates everything and raises the
# documented errors. Both paths run the same compute functions, so they give
# the same bits.
# ---------------------------------------------------------------------------

cdef inline int plain_array(object a, int ndim, int typenum) noexcept:
    """Whether `a` is an exact ndarray of this rank and dtype, C-contiguous, aligned,
    in native byte order (the type number does not say the byte order: '>f4' is
    NPY_FLOAT32 too)."""
    if not cnp.PyArray_CheckExact(a):
        return 0
    cdef cnp.ndarray arr = <cnp.ndarray>a
    return (cnp.PyArray_NDIM(arr) == ndim and cnp.PyArray_TYPE(arr) == typenum
            and cnp.PyArray_IS_C_CONTIGUOUS(arr) and cnp.PyArray_ISALIGNED(arr)
            and cnp.PyArray_ISNOTSWAPPED(arr))


cdef inline cnp.npy_intp dim(object a, int k) noexcept:
    return cnp.PyArray_DIMS(<cnp.ndarray>a)[k]


cdef inline void* data(object a) noexcept:
    return cnp.PyArray_DATA(<cnp.ndarray>a)


cdef inline bint plain_float(object v) noexcept:
    """A Python float, or an int (not bool) that converts to a double without
    overflow (a huge int takes the general path, which raises the documented error)."""
    return type(v) is float or (type(v) is int and -1e308 < v < 1e308)


cdef inline bint plain_int(object v) noexcept:
    """A Python int or a NumPy integer scalar (neither is a bool): TF-style
    code often passes seq_len_max as np.int64."""
    return type(v) is int or isinstance(v, cnp.integer)


cdef int lstm_plain_dtype(int x_rank, x, cs_prev, h_prev, w, wci, wcf, wco, b,
                          void** ptr) noexcept:
    """NPY_FLOAT32 or NPY_FLOAT64 if the LSTM arguments are plain arrays of one
    float dtype (x of rank x_rank, the states and w of rank 2, the vectors of
    rank 1; the shapes are checked by the caller), with ptr[0:8] their data in
    this order; else -1. An empty x or cs_prev is declined: the Python layer
    returns such calls early."""
    if not cnp.PyArray_CheckExact(x) or cnp.PyArray_SIZE(<cnp.ndarray>x) == 0:
        return -1
    cdef int typenum = cnp.PyArray_TYPE(<cnp.ndarray>x)
    if typenum != cnp.NPY_FLOAT32 and typenum != cnp.NPY_FLOAT64:
        return -1
    if not (plain_array(x, x_rank, typenum) and plain_array(cs_prev, 2, typenum)
            and cnp.PyArray_SIZE(<cnp.ndarray>cs_prev) != 0
            and plain_array(h_prev, 2, typenum) and plain_array(w, 2, typenum)
            and plain_array(wci, 1, typenum) and plain_array(wcf, 1, typenum)
            and plain_array(wco, 1, typenum) and plain_array(b, 1, typenum)):
        return -1
    ptr[0], ptr[1], ptr[2], ptr[3] = data(x), data(cs_prev), data(h_prev), data(w)
    ptr[4], ptr[5], ptr[6], ptr[7] = data(wci), data(wcf), data(wco), data(b)
    return typenum


cdef extern from "numpy/arrayobject.h":
    # The call steals a reference to descr.
    object PyArray_NewFromDescr(type subtype, cnp.dtype descr, int nd,
                                cnp.npy_intp* dims, cnp.npy_intp* strides, void* data,
                                int flags, PyObject* obj)


cdef extern from "Python.h":
    ctypedef struct PyTypeObject:
        PyObject* (*tp_alloc)(PyTypeObject*, Py_ssize_t)
    bint PyType_FastSubclass(PyTypeObject*, unsigned long)
    unsigned long Py_TPFLAGS_TUPLE_SUBCLASS


cdef extern from "brnn_alloc.h" nogil:
    void* brnn_big_alloc(size_t nbytes)
    void brnn_big_free(void* p, size_t nbytes)


cdef extern from "Python.h":
    int PyTraceMalloc_Track(unsigned int domain, uintptr_t ptr, size_t size)
    int PyTraceMalloc_Untrack(unsigned int domain, uintptr_t ptr)


# tracemalloc's domain for the blocks of big_empty: NumPy's own (NPY_TRACE_DOMAIN), so
# that they count where NumPy's arrays do.
cdef enum:
    BIG_BLOCK_DOMAIN = 389047
cdef const char* BIG_BLOCK_NAME = b"blockrnn big block"


cdef void free_big_block(object capsule) noexcept:
    """The destructor of a big_empty array's base: unmaps its block."""
    cdef void* p = PyCapsule_GetPointer(capsule, BIG_BLOCK_NAME)
    PyTraceMalloc_Untrack(BIG_BLOCK_DOMAIN, <uintptr_t>p)
    brnn_big_free(p, <size_t>PyCapsule_GetContext(capsule))


cdef cnp.ndarray big_empty(int ndim, cnp.npy_intp* dims, int typenum, Py_ssize_t nbytes):
    """A new C-contiguous array of nbytes (> 0) bytes on a block of brnn_big_alloc
    (include/brnn_alloc.h: huge pages, faulted in at once, before the kernel's
    threads write it), or NumPy's empty array where no such block can be mapped.
    The block is the array's base (a capsule) and is unmapped with it."""
    cdef void* p
    with nogil:
        p = brnn_big_alloc(nbytes)
    if p == NULL:
        return cnp.PyArray_EMPTY(ndim, dims, typenum, 0)
    try:
        base = PyCapsule_New(p, BIG_BLOCK_NAME, NULL)
        PyCapsule_SetContext(base, <void*>nbytes)
    except BaseException:
        brnn_big_free(p, nbytes)
        raise
    PyCapsule_SetDestructor(base, free_big_block)   # from here on the base owns the block
    PyTraceMalloc_Track(BIG_BLOCK_DOMAIN, <uintptr_t>p, nbytes)
    cdef cnp.dtype descr = cnp.PyArray_DescrFromType(typenum)
    Py_INCREF(descr)     # PyArray_NewFromDescr steals it
    arr = PyArray_NewFromDescr(cnp.ndarray, descr, ndim, dims, NULL, p,
                               cnp.NPY_ARRAY_CARRAY, NULL)
    cnp.set_array_base(arr, base)
    return arr


# Outputs smaller than this (each) are the views of one block (see new_outputs).
cdef enum:
    SHARED_BLOCK_BYTES_C = 1 << 22
SHARED_BLOCK_BYTES = SHARED_BLOCK_BYTES_C


cdef inline bint shares_block(Py_ssize_t bytes_each) noexcept:
    """Whether outputs of bytes_each bytes each are the views of one block."""
    return bytes_each < SHARED_BLOCK_BYTES_C


def output_buffers(int count, tuple shape, dtype):
    """`count` new C-contiguous arrays of `shape` and `dtype` for a forward's
    outputs on the general path: the views block[k] of one array, or separate
    arrays, by the rule of new_outputs."""
    dtype = np.dtype(dtype)
    cdef Py_ssize_t bytes_each = dtype.itemsize
    for n in shape:
        bytes_each *= n
    if shares_block(bytes_each):
        return list(np.empty((count,) + shape, dtype=dtype))
    cdef cnp.npy_intp dims[3]
    cdef int ndim = len(shape)
    if ndim > 3:
        raise ValueError(f"output_buffers: at most 3 dimensions, got shape {shape}")
    for k in range(ndim):
        dims[k] = shape[k]
    return [big_empty(ndim, dims, dtype.num, bytes_each) for _ in range(count)]


cdef tuple new_outputs(type output_type, int count, int typenum, void** ptr,
                       cnp.npy_intp n0, cnp.npy_intp n1, cnp.npy_intp n2=-1):
    """output_type(*arrays), a tuple subclass (the op's namedtuple) of `count`
    new C-contiguous arrays of shape (n0, n1), or (n0, n1, n2) if n2 >= 0, with
    ptr[k] their data.

    Arrays of less than SHARED_BLOCK_BYTES (4 MB) each are the views block[k]
    of one array of shape (count, n0, n1[, n2]), as output_buffers makes them
    on the general path. A forward's outputs are fresh memory, zeroed by
    the OS on first touch. Seven arrays of 3.3 MB get 4 KB pages, and glibc
    returns them to the OS at every call; their 23 MB block gets NumPy's huge
    pages (it asks for them from 4 MB on) and stays in glibc's heap between
    calls (measured, block_lstm_v2 at 200,16,128,256 in a loop: 5076 page
    faults, 14.5 ms of system time and 36.4 ms per call, against 32 faults and
    24.3 ms). Arrays of 4 MB or more are separate: each gets huge pages by
    itself, and their block would be above 32 MB, which glibc always maps
    afresh (measured at 100,64,512,512 between the benchmark's peers, median
    of 7, six runs: 209-255 ms separate, 240-278 ms as one block); they are
    big_empty's blocks, on huge pages and faulted in before the kernel runs.
    The tuple is built the way tuple.__new__ builds a subclass instance
    (tp_alloc, then the items), without its method call, argument list and
    temporary tuple."""
    if not PyType_FastSubclass(<PyTypeObject*>output_type, Py_TPFLAGS_TUPLE_SUBCLASS):
        raise TypeError(f"output_type must be a tuple subclass, not {output_type!r}")
    cdef cnp.npy_intp dims[4]
    dims[0] = count
    dims[1] = n0
    dims[2] = n1
    dims[3] = n2
    cdef int ndim = 3 if n2 >= 0 else 2
    cdef Py_ssize_t nbytes = (n0 * n1 * (n2 if n2 >= 0 else 1)
                              * (4 if typenum == cnp.NPY_FLOAT32 else 8))
    cdef cnp.ndarray block = None
    cdef cnp.dtype descr = None
    cdef int k
    if shares_block(nbytes):
        block = cnp.PyArray_EMPTY(ndim + 1, dims, typenum, 0)
        descr = block.dtype
    cdef PyObject* p = (<PyTypeObject*>output_type).tp_alloc(<PyTypeObject*>output_type,
                                                            count)
    if p == NULL:
        raise MemoryError()
    cdef tuple outs = <tuple>p   # a second reference; drop tp_alloc's
    Py_DECREF(outs)
    for k in range(count):   # a failure here frees outs and the arrays made so far
        if block is None:
            arr = big_empty(ndim, &dims[1], typenum, nbytes)
            ptr[k] = data(arr)
        else:
            ptr[k] = <char*>cnp.PyArray_DATA(block) + k * nbytes
            Py_INCREF(descr)     # PyArray_NewFromDescr steals it
            arr = PyArray_NewFromDescr(cnp.ndarray, descr, ndim, &dims[1], NULL, ptr[k],
                                       cnp.NPY_ARRAY_CARRAY, NULL)
            cnp.set_array_base(arr, block)
        Py_INCREF(arr)       # PyTuple_SET_ITEM steals it
        PyTuple_SET_ITEM(outs, k, arr)
    return outs


cdef void* new_workspace(Py_ssize_t elements, int typenum) except NULL:
    """Room for `elements` values of this dtype, from PyMem_RawMalloc (seen by
    tracemalloc); the caller frees it with PyMem_RawFree."""
    cdef void* ws = PyMem_RawMalloc(elements * (4 if typenum == cnp.NPY_FLOAT32 else 8))
    if ws == NULL:
        raise MemoryError()
    return ws
