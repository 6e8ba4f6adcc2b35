"""The checker's monitors, one per family of invariants, over a shared ground truth.

``truth`` holds what they share (incarnations, clients, the violation reporter); each other
module is one monitor that names the event kinds it reads. ``racesim.engine_model.checker``
dispatches events to them.
"""
