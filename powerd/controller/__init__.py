"""The cluster controller: keeps every rack, row and the site inside its budget."""
