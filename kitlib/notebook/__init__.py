"""The notebooks' layer: parameters, presets, the picker, the four stages, running notebooks headless."""
