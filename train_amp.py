#!/usr/bin/env python3
"""Placeholder: replaced by the train_amp issue."""
