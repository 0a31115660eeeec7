"""Analysis: tables from metrics records. Reading them, cells and confidence intervals, the
communication model, predicted scaling, the summary, and `Study` that holds it all.
May import: runners, launch, measure, models, plan, data.
"""
