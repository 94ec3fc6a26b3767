"""explore"""
