"""TensorFlow's block-RNN raw ops under their TensorFlow names.

Drop-in for ``tf.raw_ops``: the same keyword-only arguments, defaults and
output field names, so code written against ``tf.raw_ops`` ports by changing
the module. ``BlockGRU`` and ``BlockGRUGrad`` are blockrnn's own (TensorFlow
has no sequence GRU), named in the same style. ``name`` is accepted and ignored. Each op is a thin layer over the
snake_case function named in its docstring, which documents every shape.
Outputs are NumPy arrays.
"""
from blockrnn.gru import block_gru, block_gru_grad, gru_block_cell, gru_block_cell_grad
from blockrnn.lstm import (
    block_lstm, block_lstm_grad, block_lstm_grad_v2, block_lstm_v2, lstm_block_cell,
    lstm_block_cell_grad)

__all__ = ["LSTMBlockCell", "LSTMBlockCellGrad", "BlockLSTM", "BlockLSTMGrad",
           "BlockLSTMV2", "BlockLSTMGradV2", "GRUBlockCell", "GRUBlockCellGrad",
           "BlockGRU", "BlockGRUGrad"]


def LSTMBlockCell(*, x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias=1.0,
                  cell_clip=3.0, use_peephole=False, name=None):
    """TensorFlow's ``LSTMBlockCell``: see ``blockrnn.lstm_block_cell``."""
    return lstm_block_cell(x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias=forget_bias,
                           cell_clip=cell_clip, use_peephole=use_peephole)


def LSTMBlockCellGrad(*, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co,
                      cs_grad, h_grad, use_peephole, name=None):
    """TensorFlow's ``LSTMBlockCellGrad``: see ``blockrnn.lstm_block_cell_grad``."""
    return lstm_block_cell_grad(x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co,
                                cs_grad, h_grad, use_peephole=use_peephole)


def BlockLSTM(*, seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias=1.0,
              cell_clip=3.0, use_peephole=False, name=None):
    """TensorFlow's ``BlockLSTM``: see ``blockrnn.block_lstm``."""
    return block_lstm(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b,
                      forget_bias=forget_bias, cell_clip=cell_clip, use_peephole=use_peephole)


def BlockLSTMV2(*, seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, cell_clip=0.0,
                use_peephole=False, name=None):
    """TensorFlow's ``BlockLSTMV2`` (IFCO, no forget_bias): see ``blockrnn.block_lstm_v2``."""
    return block_lstm_v2(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b,
                         cell_clip=cell_clip, use_peephole=use_peephole)


def BlockLSTMGrad(*, seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci,
                  co, h, cs_grad, h_grad, use_peephole, name=None):
    """TensorFlow's ``BlockLSTMGrad``: see ``blockrnn.block_lstm_grad``."""
    return block_lstm_grad(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o,
                           ci, co, h, cs_grad, h_grad, use_peephole=use_peephole)


def BlockLSTMGradV2(*, seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci,
                    co, h, cs_grad, h_grad, use_peephole, name=None):
    """TensorFlow's ``BlockLSTMGradV2``: see ``blockrnn.block_lstm_grad_v2``."""
    return block_lstm_grad_v2(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f,
                              o, ci, co, h, cs_grad, h_grad, use_peephole=use_peephole)


def GRUBlockCell(*, x, h_prev, w_ru, w_c, b_ru, b_c, name=None):
    """TensorFlow's ``GRUBlockCell``: see ``blockrnn.gru_block_cell``."""
    return gru_block_cell(x, h_prev, w_ru, w_c, b_ru, b_c)


def GRUBlockCellGrad(*, x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, d_h, name=None):
    """TensorFlow's ``GRUBlockCellGrad``: see ``blockrnn.gru_block_cell_grad``."""
    return gru_block_cell_grad(x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, d_h)


def BlockGRU(*, seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c, sequence_length=None,
             name=None):
    """blockrnn's sequence GRU (no TensorFlow op): see ``blockrnn.block_gru``."""
    return block_gru(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c,
                     sequence_length=sequence_length)


def BlockGRUGrad(*, seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, h, h_grad,
                 sequence_length=None, name=None):
    """Backward of ``BlockGRU``: see ``blockrnn.block_gru_grad``."""
    return block_gru_grad(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, h, h_grad,
                          sequence_length=sequence_length)
