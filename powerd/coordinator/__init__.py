"""The site coordinator of a tree of controllers: grants each leaf controller a budget."""
