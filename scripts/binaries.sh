# The build's binaries that a GPU call runs: sourced by scripts/gpu-suite.sh
# (which checks that prebuilt ones load) and scripts/pack.sh (which packs them).
TG_BINARIES="tg_tests tg_cuda_tests bench_ops train_step region_attention split_gemm wgmma_rate attention_demo train_edit_diffusion
  libtapegrad.so"
