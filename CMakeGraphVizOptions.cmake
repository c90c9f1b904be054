# What `cmake --graphviz` draws (tools/draw-architecture reads it for docs/images/architecture.svg):
# the project's own static libraries, which are the layers, and their links. Executables (the command
# line, the tests), interface libraries (touchstone_options, touchstone_core), object libraries
# (the allocation tracker) and third-party libraries are left out, and one file for the whole graph is
# written instead of one per target.
set(GRAPHVIZ_EXECUTABLES FALSE)
set(GRAPHVIZ_INTERFACE_LIBS FALSE)
set(GRAPHVIZ_OBJECT_LIBS FALSE)
set(GRAPHVIZ_EXTERNAL_LIBS FALSE)
set(GRAPHVIZ_UNKNOWN_LIBS FALSE)
set(GRAPHVIZ_GENERATE_PER_TARGET FALSE)
set(GRAPHVIZ_GENERATE_DEPENDERS FALSE)
