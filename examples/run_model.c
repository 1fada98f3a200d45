/* Run a model built by `tensorgen build MODEL -o DIR` without Python.
 *
 *   gcc -O2 examples/run_model.c -o run_model "$(realpath DIR)/model.so"
 *   ./run_model DIR [input0.bin ...]      # raw little-endian tensors; zeros when omitted
 *
 * Link model.so by its absolute path: the library has no soname, so the program records the path it was
 * linked with and, given a relative one, finds the library only from the folder it was linked in.
 *
 * It loads DIR/weights.bin, runs the model once, prints the first outputs' leading values and the
 * mean latency of 10 runs, and writes each output to outputN.bin in the current directory.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct tensorgen_model tensorgen_model;
tensorgen_model* tensorgen_model_init(const void* weights);
int tensorgen_model_run(tensorgen_model* m, const void* const* inputs, void* const* outputs);
void tensorgen_model_free(tensorgen_model* m);
int tensorgen_model_num_inputs(void);
int tensorgen_model_num_outputs(void);
long tensorgen_model_input_bytes(int i);
long tensorgen_model_output_bytes(int i);

static void* read_file(const char* path, long expected) {
  FILE* f = fopen(path, "rb");
  if (!f) { perror(path); exit(1); }
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  if (expected >= 0 && size != expected) {
    fprintf(stderr, "%s: %ld bytes, expected %ld\n", path, size, expected);
    exit(1);
  }
  void* data = aligned_alloc(64, (size + 63) / 64 * 64 + 64);
  if (fread(data, 1, size, f) != (size_t)size) { perror(path); exit(1); }
  fclose(f);
  return data;
}

int main(int argc, char** argv) {
  if (argc < 2) { fprintf(stderr, "usage: %s MODEL_DIR [input0.bin ...]\n", argv[0]); return 2; }
  char path[4096];
  snprintf(path, sizeof path, "%s/weights.bin", argv[1]);
  void* weights = read_file(path, -1);
  int n_in = tensorgen_model_num_inputs(), n_out = tensorgen_model_num_outputs();
  void** inputs = calloc(n_in, sizeof(void*));
  void** outputs = calloc(n_out, sizeof(void*));
  for (int i = 0; i < n_in; ++i)
    inputs[i] = 2 + i < argc ? read_file(argv[2 + i], tensorgen_model_input_bytes(i))
                             : calloc(1, tensorgen_model_input_bytes(i));
  for (int i = 0; i < n_out; ++i) outputs[i] = malloc(tensorgen_model_output_bytes(i));

  tensorgen_model* model = tensorgen_model_init(weights); /* a CPU model reads them in place: keep them */
  if (!model || tensorgen_model_run(model, (const void* const*)inputs, outputs) != 0) {
    fprintf(stderr, "model failed\n");
    return 1;
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int r = 0; r < 10; ++r) tensorgen_model_run(model, (const void* const*)inputs, outputs);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ms = ((t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6) / 10;

  for (int i = 0; i < n_out; ++i) {
    const float* y = outputs[i];
    printf("output%d:", i);
    for (int j = 0; j < 5 && j * 4 < tensorgen_model_output_bytes(i); ++j) printf(" %g", y[j]);
    printf("\n");
    snprintf(path, sizeof path, "output%d.bin", i);
    FILE* f = fopen(path, "wb");
    fwrite(outputs[i], 1, tensorgen_model_output_bytes(i), f);
    fclose(f);
  }
  printf("latency: %.3f ms\n", ms);
  tensorgen_model_free(model);
  free(weights);
  return 0;
}
