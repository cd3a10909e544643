"""ddptop's example code, installed with it: `wide_mlp` (the wire-lab profile's model), `my_model` (your own model,
data set and loss: copy it) and `own_loop` (your own training loop under torchrun: `torchrun -m ddptop.examples.own_loop`)."""
