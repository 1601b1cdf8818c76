# blockrnn's C-level API: `from blockrnn.capi cimport brnn_block_lstm_f32` in a
# Cython extension (the functions live in blockrnn._kernels; the contract and
# every shape are documented in blockrnn/_kernels.pxd).
from blockrnn._kernels cimport (
    BRNN_ICFO, BRNN_IFCO,
    brnn_lstm_cell_f32, brnn_lstm_cell_f64,
    brnn_block_lstm_f32, brnn_block_lstm_f64,
    brnn_block_lstm_grad_f32, brnn_block_lstm_grad_f64,
    brnn_gru_cell_f32, brnn_gru_cell_f64,
    brnn_block_gru_f32, brnn_block_gru_f64,
    brnn_block_gru_grad_f32, brnn_block_gru_grad_f64,
)
