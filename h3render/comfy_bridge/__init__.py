"""h3render.comfy_bridge: ComfyUI custom nodes that hand renders to the h3render queue.

    nodes    the node classes (NODE_CLASS_MAPPINGS); the only module importing ComfyUI or torch
    spec     INPUT_TYPES / RETURN_TYPES of each node (plain data, checked by tests)
    inputs   widget values -> job payloads and sweep grids (pure)
    client   enqueue, await, cancel, sweep, read back (h3render.queue; hooks for progress/interrupt)
    sheet    contact sheets of posters labelled with axis values (pure)
    errors   what the nodes raise, with messages for ComfyUI's error panel

ComfyUI loads the nodes through the small package `h3render comfyui install DIR`
writes into DIR/custom_nodes/h3render/. Importing this package does not import
ComfyUI, so everything but `nodes` works (and is tested) without it.
"""
