"""Data loading for a notebook (CoorDL, DS-Analyzer): coordinated preparation and more."""
