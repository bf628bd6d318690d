// phasekv: forwarding body; `Vec<Arch>` of one target pass moved to phasekv/cpu/kernels/vec.inl
// (no include guard, like the body it forwards to).
#include "phasekv/cpu/kernels/vec.inl"
