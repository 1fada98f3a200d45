"""Code generation: lowering tensor programs to C and building them."""
