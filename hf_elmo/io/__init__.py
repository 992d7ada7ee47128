"""Reading the input files of the commands and features; writing their outputs atomically."""
