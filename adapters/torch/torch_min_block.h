/* torch_min_block.h - the least a PyTorch tensor gets from the adapter, for the shim (fabpool_torch.c) and the
 * C++ allocator (torch_core.cpp) alike: C and C++. */
#ifndef FP_TORCH_MIN_BLOCK_H
#define FP_TORCH_MIN_BLOCK_H

/* A tensor of fewer bytes is given a block of this many, so that every tensor's base is aligned to 256 as
 * cudaMalloc's is: kernels pick their vector widths from a tensor's base, and PyTorch's own allocator rounds
 * every tensor up to 512 bytes, so code written for it never sees a smaller alignment.  fabpool's classes below
 * 256 bytes are aligned to their size only. */
#define FT_MIN_BLOCK 256u

#endif
