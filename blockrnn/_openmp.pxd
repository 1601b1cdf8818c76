# The only place blockrnn talks to the OpenMP runtime (include/brnn_openmp.h
# provides serial fallbacks when the extension is built without OpenMP).
cdef extern from "brnn_openmp.h" nogil:
    bint BRNN_OPENMP_ENABLED
    int brnn_omp_get_max_threads()
    int brnn_omp_get_thread_num()
    int brnn_omp_get_num_threads()
    int brnn_omp_get_num_procs()
    void brnn_omp_barrier()
